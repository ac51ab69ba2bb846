"""The extraction ledger: how extraction went for every saved turn.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "extractions",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("turn_id", Id, nullable=False),
        sa.Column("extractor", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Double(), nullable=False),
        sa.Column("entity_count", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_extractions")),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_extractions_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.UniqueConstraint(
            "session_id", "turn_id", name=op.f("uq_extractions_session_id_turn_id")
        ),
    )
    op.create_index(
        op.f("ix_extractions_status_session_id_turn_id"),
        "extractions",
        ["status", "session_id", "turn_id"],
    )
    op.create_index(op.f("ix_extractions_turn_id"), "extractions", ["turn_id"])
    # Turns saved before the ledger existed: their extraction is unknown, not failed.
    op.execute(
        "INSERT INTO extractions (session_id, turn_id, extractor, status, error, latency_ms,"
        " entity_count, attempts, updated_at)"
        " SELECT t.session_id, t.id, 'unknown', 'ok', NULL, 0,"
        " (SELECT COUNT(*) FROM contexts c WHERE c.turn_id = t.id), 1, t.created_at"
        " FROM turns t"
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_extractions_turn_id"), table_name="extractions")
    op.drop_index(op.f("ix_extractions_status_session_id_turn_id"), table_name="extractions")
    op.drop_table("extractions")
