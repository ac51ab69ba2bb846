"""SQLite: turn ids are never reused (AUTOINCREMENT), because they order snippets.

Without AUTOINCREMENT, SQLite gives a new row the id of a deleted last row; an entity
first seen in a deleted turn would then sort after an entity first seen later. Postgres
sequences never go back, so this revision changes nothing there.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# The views read the table being rebuilt and SQLite checks them when it renames the copy,
# so they are dropped and created again (as revisions 0001 and 0003 defined them).
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


def _rebuild_turns(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute("DROP VIEW entity_snippets")
    op.execute("DROP VIEW entity_overview")
    with op.batch_alter_table(
        "turns", recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
    ):
        pass
    op.execute(ENTITY_OVERVIEW)
    op.execute(ENTITY_SNIPPETS)


def upgrade() -> None:
    _rebuild_turns(autoincrement=True)


def downgrade() -> None:
    _rebuild_turns(autoincrement=False)
