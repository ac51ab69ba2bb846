"""A person's judgements of suggested duplicates: ``identity_judgements``.

``confirm_same`` records "same" with the merge it made, ``reject_same`` records
"different": that pair is never suggested again in its session. One row per pair of
entities (their keys in sorted order) per session; the primary key leads with
``session_id`` (tables distributed by session on Citus). A new table only: the previous
release never reads it, so the upgrade is safe under live writes, and a downgrade drops
it (the judgements are lost; merges made by confirmations stay in the merge log). On a
database Citus distributes already, the new table is distributed by session too.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SESSION_ID_LENGTH = 255
NAME_LENGTH = 256


def upgrade() -> None:
    op.create_table(
        "identity_judgements",
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
        sa.Column("key_a", sa.Text(), nullable=False),
        sa.Column("key_b", sa.Text(), nullable=False),
        sa.Column("name_a", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("name_b", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("merge_id", sa.BigInteger(), nullable=True),
        sa.Column("decided_by", sa.String(SESSION_ID_LENGTH), nullable=False),
        sa.Column("decided_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "key_a", "key_b", name="pk_identity_judgements"),
    )
    if _turns_distributed():
        # A database distributed by `db distribute` before this revision: the new table is
        # distributed as that command would have, co-located with the session's turns.
        op.execute(
            "SELECT create_distributed_table('identity_judgements', 'session_id', "
            "colocate_with => 'turns')"
        )


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
    op.drop_table("identity_judgements")
