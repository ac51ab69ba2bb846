"""The views by session: every join between the tables matches ``session_id`` too, and each
entity's count and newest snippet come from one window over its session's snippets, not
from subqueries correlated by entity id.

A view read for one session (``WHERE session_id = ...``) then names the session of every
table it reads: Postgres pushes the filter down to each of them, and Citus runs the read on
the session's shard alone (it refused both views of revision 0007 on distributed tables:
their joins and subqueries matched ids only). The rows are the same as before.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The window is partitioned by session first, so a filter on the view's session_id reaches
# the snippets inside the subquery (Postgres pushes a filter on a partition column).
ENTITY_OVERVIEW = """
CREATE VIEW entity_overview AS
SELECT
    e.session_id,
    e.name,
    e.entity_type,
    COALESCE(c.contexts_count, 0) AS contexts_count,
    e.first_seen,
    e.last_seen,
    c.text AS last_context
FROM entities e
LEFT JOIN (
    SELECT
        session_id,
        entity_id,
        text,
        ROW_NUMBER() OVER (
            PARTITION BY session_id, entity_id ORDER BY turn_seq DESC, id DESC
        ) AS recency,
        COUNT(*) OVER (PARTITION BY session_id, entity_id) AS contexts_count
    FROM contexts
) c ON c.session_id = e.session_id AND c.entity_id = e.id AND c.recency = 1
"""

# session_id is the snippet's (equal to its entity's): the column the window is partitioned
# by, so a filter on it is pushed below the window.
ENTITY_SNIPPETS = """
CREATE VIEW entity_snippets AS
SELECT
    c.session_id,
    e.name,
    e.entity_type,
    ROW_NUMBER() OVER (
        PARTITION BY c.session_id, c.entity_id ORDER BY c.turn_seq DESC, c.id DESC
    ) AS recency,
    c.text,
    c.turn_id,
    t.created_at AS turn_created_at
FROM contexts c
JOIN entities e ON e.session_id = c.session_id AND e.id = c.entity_id
LEFT JOIN turns t ON t.session_id = c.session_id AND t.id = c.turn_id
"""


# Revision 0007's, which a downgrade puts back.
OVERVIEW_0007 = """
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

SNIPPETS_0007 = """
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


def _replace(overview: str, snippets: str) -> None:
    op.execute("DROP VIEW entity_snippets")
    op.execute("DROP VIEW entity_overview")
    op.execute(overview)
    op.execute(snippets)


def upgrade() -> None:
    _replace(ENTITY_OVERVIEW, ENTITY_SNIPPETS)


def downgrade() -> None:
    _replace(OVERVIEW_0007, SNIPPETS_0007)
