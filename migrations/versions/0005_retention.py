"""Retention: the policy table, and each snippet's own creation time.

``contexts.created_at`` is backfilled from the snippet's turn (``turns.created_at``); a
note added with ``add_context`` belongs to no turn and takes its entity's ``last_seen``
(the time of the entity's newest activity, at or after the note). Then the column is made
NOT NULL, defaulting to now (for the previous release, which does not write it): on
SQLite by rebuilding the table (batch mode), around which the views that
read it are dropped and created again (as revisions 0001 and 0003 defined them).

On Postgres, when the revision runs in transactions of its own (``db upgrade``), nothing
holds the table's lock for long: the column is added nullable with its default (new rows of
the previous release take it), committed, backfilled in batches of short transactions,
and made NOT NULL through a check constraint validated first (VALIDATE lets reads and
writes go on; SET NOT NULL then needs no scan). Run so on SQLite, the table is rebuilt with the
column in short transactions (``zerda_store.db.migration.sqlite_online``): each snippet
copied, in batches or as the previous release writes it, takes its time on the way. Re-run
after an interruption, it finds what is done and goes on.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from alembic.operations import BatchOperations

from zerda_store.db.migration import sqlite_online

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

SESSION_ID_LENGTH = 255
TYPE_LENGTH = 64

ENTITY_OVERVIEW = """
CREATE VIEW entity_overview AS
SELECT
    e.session_id,
    e.name,
    e.entity_type,
    (SELECT COUNT(*) FROM contexts c WHERE c.entity_id = e.id) AS contexts_count,
    e.first_seen,
    e.last_seen,
    (SELECT c.text FROM contexts c WHERE c.entity_id = e.id
     ORDER BY c.turn_seq DESC, c.id DESC LIMIT 1) AS last_context
FROM entities e
"""

ENTITY_SNIPPETS = """
CREATE VIEW entity_snippets AS
SELECT
    e.session_id,
    e.name,
    e.entity_type,
    ROW_NUMBER() OVER (
        PARTITION BY c.entity_id ORDER BY c.turn_seq DESC, c.id DESC
    ) AS recency,
    c.text,
    c.turn_id,
    t.created_at AS turn_created_at
FROM contexts c
JOIN entities e ON e.id = c.entity_id
LEFT JOIN turns t ON t.id = c.turn_id
"""

BACKFILL_FROM_TURNS = """
UPDATE contexts SET created_at = (SELECT t.created_at FROM turns t WHERE t.id = contexts.turn_id)
WHERE turn_id IS NOT NULL
"""
BACKFILL_NOTES = """
UPDATE contexts SET created_at = (SELECT e.last_seen FROM entities e WHERE e.id = contexts.entity_id)
WHERE created_at IS NULL
"""


# The default of ``created_at``: now, in epoch seconds. The library always writes the
# column; the default is for the previous release, which does not know it, so that its
# saves go through while both releases run (a rolling deploy).
EPOCH_NOW = {
    "postgresql": "date_part('epoch', now())",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}


# Rows per short backfill transaction (Postgres, online).
BATCH_ROWS = 20_000
IN_BATCH = " AND id >= :low AND id < :high"
NOT_NULL_CHECK = "ck_contexts_created_at_backfilled"
# Each in a short transaction (a table's exclusive lock, briefly), but VALIDATE outside any.
CHECK_ADDED = (
    f"ALTER TABLE contexts DROP CONSTRAINT IF EXISTS {NOT_NULL_CHECK}",
    f"ALTER TABLE contexts ADD CONSTRAINT {NOT_NULL_CHECK} CHECK (created_at IS NOT NULL) "
    "NOT VALID",
)
CHECK_VALIDATED = f"ALTER TABLE contexts VALIDATE CONSTRAINT {NOT_NULL_CHECK}"
NOT_NULL_SET = (
    "ALTER TABLE contexts ALTER COLUMN created_at SET NOT NULL",
    f"ALTER TABLE contexts DROP CONSTRAINT {NOT_NULL_CHECK}",
)
# Set by env.py: the revision runs in transactions of its own on Postgres.
ONLINE_DDL = "online_ddl"


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _online() -> bool:
    return bool(op.get_context().config.attributes.get(ONLINE_DDL))


# A snippet's time, from the snippet's row (``{row}``): its turn's, else (a note) its
# entity's last_seen.
CREATED_AT_OF_ROW = (
    "COALESCE((SELECT t.created_at FROM turns t WHERE t.id = {row}.turn_id), "
    "(SELECT e.last_seen FROM entities e WHERE e.id = {row}.entity_id))"
)


def _add_created_at_sqlite_online() -> None:
    """SQLite: rebuild ``contexts`` with ``created_at`` (NOT NULL, defaulting to now) in
    short transactions, each row given its time as it is copied."""
    bind = op.get_bind()
    if "created_at" in {column["name"] for column in sa.inspect(bind).get_columns("contexts")}:
        return  # rebuilt by an interrupted run

    def add(batch: BatchOperations) -> None:
        batch.add_column(
            sa.Column(
                "created_at",
                sa.Double(),
                nullable=False,
                server_default=sa.text(EPOCH_NOW["sqlite"]),
            )
        )

    with sqlite_online.apart(bind) as pacing:
        sqlite_online.rebuild_table(
            bind, "contexts", add, pacing, values={"created_at": CREATED_AT_OF_ROW}
        )


def _add_created_at_online() -> None:
    """Add ``contexts.created_at`` without holding the table's lock for long (see the
    module's docstring). Postgres: the steps that take the table's lock in short
    transactions (which `db upgrade` lets wait briefly for it), the others outside any."""
    if _sqlite():
        _add_created_at_sqlite_online()
        return
    bind = op.get_bind()
    columns = {column["name"] for column in sa.inspect(bind).get_columns("contexts")}
    if "created_at" not in columns:
        op.add_column("contexts", sa.Column("created_at", sa.Double(), nullable=True))
        op.alter_column("contexts", "created_at", server_default=sa.text(EPOCH_NOW["postgresql"]))
    with op.get_context().autocommit_block():
        bind = op.get_bind()
        low, high = bind.exec_driver_sql("SELECT min(id), max(id) FROM contexts").one()
        for start in range(low or 0, (high or -1) + 1, BATCH_ROWS):
            batch = {"low": start, "high": start + BATCH_ROWS}
            bind.execute(sa.text(BACKFILL_FROM_TURNS + IN_BATCH + " AND created_at IS NULL"), batch)
            bind.execute(sa.text(BACKFILL_NOTES + IN_BATCH), batch)
    for statement in CHECK_ADDED:
        op.execute(statement)
    with op.get_context().autocommit_block():
        op.get_bind().exec_driver_sql(CHECK_VALIDATED)
    for statement in NOT_NULL_SET:
        op.execute(statement)


def _alter_contexts(change: str) -> None:
    """Add (nullable, then NOT NULL after the backfill) or drop ``contexts.created_at``."""
    sqlite = _sqlite()
    if sqlite:
        op.execute("DROP VIEW entity_snippets")
        op.execute("DROP VIEW entity_overview")
    if change == "add":
        op.add_column("contexts", sa.Column("created_at", sa.Double(), nullable=True))
        op.execute(BACKFILL_FROM_TURNS)
        op.execute(BACKFILL_NOTES)
        with op.batch_alter_table("contexts", recreate="always" if sqlite else "auto") as batch:
            batch.alter_column(
                "created_at",
                existing_type=sa.Double(),
                nullable=False,
                server_default=sa.text(EPOCH_NOW[op.get_bind().dialect.name]),
            )
    else:
        with op.batch_alter_table("contexts", recreate="always" if sqlite else "auto") as batch:
            batch.drop_column("created_at")
    if sqlite:
        op.execute(ENTITY_OVERVIEW)
        op.execute(ENTITY_SNIPPETS)


def upgrade() -> None:
    online = _online()
    if online and sa.inspect(op.get_bind()).has_table("retention_policies"):
        _add_created_at_online()  # an interrupted run: the table is made
        return
    op.create_table(
        "retention_policies",
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
        sa.Column("entity_type", sa.String(TYPE_LENGTH), nullable=False),
        sa.Column("keep_last", sa.Integer(), nullable=True),
        sa.Column("max_age", sa.Double(), nullable=True),
        sa.Column("session_idle", sa.Double(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "entity_type", name="pk_retention_policies"),
    )
    if online:
        _add_created_at_online()
    else:
        _alter_contexts("add")


def downgrade() -> None:
    _alter_contexts("drop")
    op.drop_table("retention_policies")
