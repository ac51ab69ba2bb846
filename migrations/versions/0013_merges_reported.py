"""When each merge was reported: ``entity_merges.reported_at``.

``zerda-store db upgrade`` and ``db rekey`` print each merge the key rules made with the
command that undoes it. Their report comes from the merge log: every merge of reason "key
rules" that no finished run has reported yet, so a run stopped by a ``kill -9`` leaves its
merges to the next, which prints them (a merge may be printed twice, never not at all).
A finished run sets ``reported_at``; NULL is "not reported yet". The merges logged before
this revision are NULL too: the next finished run prints them once.

A nullable column only: the previous release never reads the table, and the new release's
saves never write it. A downgrade drops it (the next upgrade prints those merges again).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("entity_merges", sa.Column("reported_at", sa.Double(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    if (
        bind.dialect.name == "postgresql"
        and bind.exec_driver_sql(
            "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"
        ).scalar()
    ):
        # As 0010's downgrade: the shards' DDL over one connection per node, so that the
        # views an earlier revision's downgrade re-creates in the same transaction are
        # allowed (Citus refuses a view command after a parallel operation).
        op.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
    with op.batch_alter_table("entity_merges") as batch:
        batch.drop_column("reported_at")
