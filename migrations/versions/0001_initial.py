"""Tables turns, entities, contexts and the view entity_overview.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

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


def upgrade() -> None:
    op.create_table(
        "turns",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("input_text", sa.Text(), nullable=False),
        sa.Column("output_text", sa.Text(), nullable=False),
        sa.Column("entity_names", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turns")),
        sa.UniqueConstraint(
            "session_id", "idempotency_key", name=op.f("uq_turns_session_id_idempotency_key")
        ),
    )
    op.create_index(op.f("ix_turns_session_id_id"), "turns", ["session_id", "id"])

    op.create_table(
        "entities",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("name_key", sa.Text(), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("entity_type", sa.String(64), nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("first_turn_id", sa.BigInteger(), nullable=False),
        sa.Column("first_position", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_entities")),
        sa.UniqueConstraint("session_id", "name_key", name=op.f("uq_entities_session_id_name_key")),
    )
    op.create_index(
        op.f("ix_entities_session_id_first_turn_id_first_position"),
        "entities",
        ["session_id", "first_turn_id", "first_position"],
    )

    op.create_table(
        "contexts",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("entity_id", Id, nullable=False),
        sa.Column("turn_id", Id, nullable=True),
        sa.Column("turn_seq", sa.BigInteger(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_contexts")),
        sa.ForeignKeyConstraint(
            ["entity_id"],
            ["entities.id"],
            name=op.f("fk_contexts_entity_id_entities"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_contexts_turn_id_turns"), ondelete="CASCADE"
        ),
    )
    op.create_index(
        op.f("ix_contexts_entity_id_turn_seq_id"), "contexts", ["entity_id", "turn_seq", "id"]
    )
    op.create_index(op.f("ix_contexts_session_id"), "contexts", ["session_id"])
    op.create_index(op.f("ix_contexts_turn_id"), "contexts", ["turn_id"])

    op.execute(ENTITY_OVERVIEW)


def downgrade() -> None:
    op.execute("DROP VIEW entity_overview")
    op.drop_table("contexts")
    op.drop_table("entities")
    op.drop_table("turns")
