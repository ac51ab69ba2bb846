"""The view entity_snippets: every snippet with its entity and its recency rank.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# recency 1 is the newest snippet of an entity; "recent" follows the database's sequence
# numbers (the turn's, then the snippet's), as the library does.
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


def upgrade() -> None:
    op.execute(ENTITY_SNIPPETS)


def downgrade() -> None:
    op.execute("DROP VIEW entity_snippets")
