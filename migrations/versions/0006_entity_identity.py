"""Entity identity: aliases, the merge log, each session's key rules, and re-keying.

Adds ``entities.core_key``, ``entity_aliases``, ``entity_merges`` and
``session_key_rules``, then re-keys every session whose keys were made by the earlier
rules (fold-v1) with the current ones (fold-v2). Entities whose new keys collide are
merged into the first seen of them through the merge log (reason "key rules"), so that
``zerda-store unmerge`` can undo each: the merged entity comes back with its old key. What
merged is logged (``alembic`` logger) and listed by ``zerda-store merges``. A session
whose keys are its names as written (``normalize_names=False``) keeps them and is
recorded as "exact".

The re-keying uses the frozen rules by name (``zerda_store.names``) and the merge code
(``zerda_store.merging``) that the library runs, on the migration's own connection.
Downgrading drops the new tables and column; keys stay as fold-v2 made them.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import logging
import time
from collections import namedtuple
from typing import Any

import sqlalchemy as sa
from alembic import op

from zerda_store.db.driver import Cursor
from zerda_store.db.unit_of_work import Transaction
from zerda_store.identity.merging import KEY_RULES_REASON, merge
from zerda_store.identity.rules import identify
from zerda_store.identity.statements import IdentityStatements
from zerda_store.model.names import EXACT, FOLD_V1, FOLD_V2

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

logger = logging.getLogger("alembic.runtime.migration")

SESSION_ID_LENGTH = 255
NAME_LENGTH = 256

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

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _alter_entities(change: str) -> None:
    """Add (nullable, then NOT NULL after re-keying) or drop ``entities.core_key``; on
    SQLite the views that read the table are dropped and made again around the rebuild."""
    sqlite = _sqlite()
    if sqlite:
        op.execute("DROP VIEW entity_snippets")
        op.execute("DROP VIEW entity_overview")
    recreate = "always" if sqlite else "auto"
    if change == "add":
        op.add_column("entities", sa.Column("core_key", sa.Text(), nullable=True))
        _rekey_sessions()
        with op.batch_alter_table("entities", recreate=recreate) as batch:
            batch.alter_column("core_key", existing_type=sa.Text(), nullable=False)
            batch.create_index("ix_entities_session_id_core_key", ["session_id", "core_key"])
    else:
        with op.batch_alter_table("entities", recreate=recreate) as batch:
            batch.drop_index("ix_entities_session_id_core_key")
            batch.drop_column("core_key")
    if sqlite:
        op.execute(ENTITY_OVERVIEW)
        op.execute(ENTITY_SNIPPETS)


def _create_tables() -> None:
    op.create_table(
        "entity_aliases",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
        sa.Column("entity_id", Id, nullable=False),
        sa.Column("alias_key", sa.Text(), nullable=False),
        sa.Column("core_key", sa.Text(), nullable=False),
        sa.Column("alias", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["entity_id"],
            ["entities.id"],
            name="fk_entity_aliases_entity_id_entities",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_entity_aliases"),
        sa.UniqueConstraint(
            "session_id", "alias_key", name="uq_entity_aliases_session_id_alias_key"
        ),
    )
    op.create_index(
        "ix_entity_aliases_session_id_core_key", "entity_aliases", ["session_id", "core_key"]
    )
    op.create_index("ix_entity_aliases_entity_id", "entity_aliases", ["entity_id"])
    op.create_table(
        "entity_merges",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
        sa.Column("kept_entity_id", sa.BigInteger(), nullable=False),
        sa.Column("merged_entity_id", sa.BigInteger(), nullable=False),
        sa.Column("kept_name", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("merged_name", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("undone_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_entity_merges"),
    )
    op.create_index("ix_entity_merges_session_id_id", "entity_merges", ["session_id", "id"])
    op.create_table(
        "session_key_rules",
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
        sa.Column("key_rules", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_session_key_rules"),
    )


ENTITIES = sa.table(
    "entities",
    *(
        sa.column(name)
        for name in (
            "id", "session_id", "name_key", "core_key", "name", "entity_type",
            "first_seen", "last_seen", "first_turn_id", "first_position",
        )
    ),
)  # fmt: skip
EntityRow = namedtuple("EntityRow", [column.name for column in ENTITIES.c])  # type: ignore[misc]
RULES = sa.table("session_key_rules", sa.column("session_id"), sa.column("key_rules"),
                 sa.column("created_at"))  # fmt: skip
MERGED_FIELDS = ("entity_type", "first_seen", "last_seen", "first_turn_id", "first_position")
# A key no rule makes (control characters are never in a name): where a key waits while
# the keys of its session are changed, so that no two entities share one in between.
PARKED = "\x01rekey "


def _rekey_sessions() -> None:
    bind = op.get_bind()
    sessions = bind.execute(sa.select(ENTITIES.c.session_id).distinct()).scalars().all()
    transaction = Transaction(Cursor(bind.dialect, bind.connection.dbapi_connection.cursor()))
    statements = IdentityStatements(bind.dialect)
    now = time.time()
    for session_id in sessions:
        rows = [
            EntityRow(**row._asdict())
            for row in bind.execute(
                sa.select(ENTITIES)
                .where(ENTITIES.c.session_id == session_id)
                .order_by(ENTITIES.c.first_turn_id, ENTITIES.c.first_position, ENTITIES.c.id)
            )
        ]
        exact = any(row.name_key != FOLD_V1.key(row.name) for row in rows)
        rules = EXACT if exact else FOLD_V2
        bind.execute(
            RULES.insert().values(session_id=session_id, key_rules=rules.name, created_at=now)
        )
        _rekey(bind, transaction, statements, session_id, rows, rules, now)


def _rekey(
    bind: Any,
    transaction: Transaction,
    statements: IdentityStatements,
    session_id: str,
    rows: list[Any],
    rules: Any,
    now: float,
) -> None:
    keepers: dict[str, Any] = {}
    merged = 0
    for row in rows:
        identity = identify(row.name, rules)
        new = row._replace(name_key=identity.key, core_key=identity.core)
        keeper = keepers.get(identity.key)
        if keeper is None:
            keepers[identity.key] = new
            continue
        old = row._replace(core_key=identity.core)
        receipt = merge(
            transaction, statements, keeper, old, reason=KEY_RULES_REASON, at=now, alias=False
        )
        merged += 1
        # The kept entity's fields as the merge left them, for the next merge into it.
        refreshed = transaction.run(statements.entity_by_id, {"entity_id": keeper.id})[0]
        keepers[identity.key] = keeper._replace(
            **{field: getattr(refreshed, field) for field in MERGED_FIELDS}
        )
        logger.info(
            "session %r: merged %r into %r (merge %d): their keys are one under %s",
            session_id, row.name, keeper.name, receipt.merge_id, rules.name,
        )  # fmt: skip
    stored = {row.id: (row.name_key, row.core_key) for row in rows}
    changed = [row for row in keepers.values() if (row.name_key, row.core_key) != stored[row.id]]
    for row in changed:
        values = {"entity_id": row.id, "name_key": f"{PARKED}{row.id}", "core_key": row.core_key}
        transaction.count(statements.set_key, values)
    for row in changed:
        values = {"entity_id": row.id, "name_key": row.name_key, "core_key": row.core_key}
        transaction.count(statements.set_key, values)
    if changed or merged:
        logger.info(
            "session %r: %d entities re-keyed with %s, %d merged",
            session_id, len(changed), rules.name, merged,
        )  # fmt: skip


def upgrade() -> None:
    _create_tables()
    _alter_entities("add")


def downgrade() -> None:
    _alter_entities("drop")
    op.drop_table("session_key_rules")
    op.drop_table("entity_merges")
    op.drop_index("ix_entity_aliases_entity_id", table_name="entity_aliases")
    op.drop_index("ix_entity_aliases_session_id_core_key", table_name="entity_aliases")
    op.drop_table("entity_aliases")
