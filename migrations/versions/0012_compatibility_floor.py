"""The schema's compatibility floor: ``compatibility_floor``, the oldest release that can
still run on the schema.

A release's processes refuse a schema whose revision they do not know, unless the schema
says they can run on it: each row names a step (a revision, or ``db contract``), the
revision a release's code must know to run on what that step left (``floor_revision``),
and why (``reason``). A process starts when it knows every row's ``floor_revision``, even
on a revision newer than its own (a later release's expansion), and refuses, naming the
step and what to do, otherwise (``zerda_store/db/migration/compatibility.py``).

Expand steps (a new table, a nullable column, an index) leave the floor alone. A contract
step, which drops or changes what an older release uses, adds its row with its own
revision as the floor, and its downgrade deletes that row:

    INSERT INTO compatibility_floor (raised_by, floor_revision, reason, raised_at)
    VALUES ('0014', '0014', 'dropped turns.legacy_flag', <epoch seconds>)

This revision records where the floor is now: the previous release (revision 0004) still
runs on the schema, until ``db contract`` drops the defaults it needs; a database
contracted already is recorded so. One small table without ``session_id``, read by every
process at start: on a database Citus distributes already, a reference table (as
``retention_policies``). A new table only: the previous release never reads it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TABLE = "compatibility_floor"
# The previous release: what it needs stays until `db contract`.
PREVIOUS_RELEASE = "0004"
# What `db contract` drops needs code that writes contexts.created_at and entities.core_key.
CONTRACTED_FLOOR = "0006"
CONTRACT_STEP = "db contract"
CONTRACT_REASON = (
    "dropped the defaults of contexts.created_at and entities.core_key that releases "
    "before revision 0006 need"
)


def upgrade() -> None:
    floor = op.create_table(
        TABLE,
        sa.Column("raised_by", sa.String(64), nullable=False),
        sa.Column("floor_revision", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raised_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("raised_by", name="pk_compatibility_floor"),
    )
    now = time.time()
    rows = [
        {
            "raised_by": revision,
            "floor_revision": PREVIOUS_RELEASE,
            "reason": "recorded the floor: the previous release still runs on this schema",
            "raised_at": now,
        }
    ]
    if _contracted():
        rows.append(
            {
                "raised_by": CONTRACT_STEP,
                "floor_revision": CONTRACTED_FLOOR,
                "reason": CONTRACT_REASON,
                "raised_at": now,
            }
        )
    op.bulk_insert(floor, rows)
    if _turns_distributed():
        op.execute(f"SELECT create_reference_table('{TABLE}')")


def _contracted() -> bool:
    """Whether `db contract` dropped the previous release's defaults before this revision."""
    columns = {c["name"]: c for c in sa.inspect(op.get_bind()).get_columns("entities")}
    return columns["core_key"].get("default") is None


def _turns_distributed() -> bool:
    """Whether Citus distributes the ``turns`` table of the schema being upgraded."""
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    if not bind.exec_driver_sql(
        "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"
    ).scalar():
        return False
    return bool(
        bind.exec_driver_sql(
            "SELECT EXISTS (SELECT FROM pg_dist_partition"
            " WHERE logicalrelid = to_regclass('turns'))"
        ).scalar()
    )


def downgrade() -> None:
    _sequential_on_citus()
    op.drop_table(TABLE)


def _sequential_on_citus() -> None:
    """On Citus, the shards' DDL over one connection per node, as 0010's downgrade does, so
    that the views an earlier revision's downgrade re-creates in the same transaction are
    allowed (Citus refuses a view command after a parallel operation on a distributed
    table)."""
    bind = op.get_bind()
    if (
        bind.dialect.name == "postgresql"
        and bind.exec_driver_sql(
            "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"
        ).scalar()
    ):
        op.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
