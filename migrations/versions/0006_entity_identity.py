"""Entity identity: aliases, the merge log, each session's key rules, and re-keying.

Adds ``entities.core_key``, ``entity_aliases``, ``entity_merges`` and
``session_key_rules``, then records each session's key rules from what the session
recorded (``migrations/frozen/evidence.py``): a session written with
``normalize_names=False`` keeps its keys and is recorded as "exact"; one written with
fold-v1 is re-keyed with fold-v2, and entities whose new keys collide are merged into the
first seen of them through the merge log (reason "key rules"), so that ``zerda-store
unmerge`` can undo each. A session that nothing tells apart keeps its keys: as "exact"
where fold-v2 would change them (and said so), else unrecorded, its next save recording
the rules of its memory. What merged is logged (``alembic`` logger), handed to
``zerda-store db upgrade`` to print, and listed by ``zerda-store merges``.

The data work is frozen in ``migrations/frozen`` (the key rules as they were, the merge in
the merge log's format), importing nothing of the library. Downgrading undoes the
upgrade's merges and gives entities their fold-v1 keys again (or refuses, saying what to
do), then drops the new tables and column.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

logger = logging.getLogger("alembic.runtime.migration")

SESSION_ID_LENGTH = 255
NAME_LENGTH = 256
FROZEN_PACKAGE = "zerda_store_frozen_migrations"
# Where `zerda-store db upgrade` collects what the upgrade did (config.attributes).
REPORT = "upgrade_report"
# Set by `zerda-store db upgrade --assume-normalized`: sessions that nothing tells apart
# that were written with normalize_names=True (True: all), re-keyed rather than kept exact.
ASSUME_NORMALIZED = "assume_normalized"

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
            # Empty for the entities the previous release saves while both releases run;
            # `zerda-store db rekey` gives them their keys and cores.
            batch.alter_column(
                "core_key", existing_type=sa.Text(), nullable=False, server_default=""
            )
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


def _frozen(module: str) -> Any:
    """A module of ``migrations/frozen``, loaded by path as a package of its own."""
    if FROZEN_PACKAGE not in sys.modules:
        folder = Path(__file__).resolve().parent.parent / "frozen"
        spec = importlib.util.spec_from_file_location(
            FROZEN_PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[FROZEN_PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{FROZEN_PACKAGE}.{module}")


def _rekey_sessions() -> None:
    attributes = op.get_context().config.attributes
    outcomes = _frozen("rekeying").rekey_sessions(
        op.get_bind(), time.time(), assume_normalized=attributes.get(ASSUME_NORMALIZED, False)
    )
    for outcome in outcomes:
        for entry in outcome.merges:
            logger.info(
                "session %r: merged %r into %r (merge %d): their keys are one under fold-v2",
                outcome.session_id, entry["merged"], entry["kept"], entry["merge_id"],
            )  # fmt: skip
        if outcome.unsure:
            logger.warning(
                "session %r: kept its keys as written (exact): nothing recorded tells whether "
                "it was written with normalize_names=True",
                outcome.session_id,
            )
    # `zerda-store db upgrade` hands a list for what the upgrade did, and prints it.
    report = attributes.get(REPORT)
    if report is not None:
        report.extend(asdict(outcome) for outcome in outcomes if outcome.key_rules)


def upgrade() -> None:
    _create_tables()
    _alter_entities("add")


def downgrade() -> None:
    _frozen("older_keys").restore_older_keys(op.get_bind(), time.time())
    _alter_entities("drop")
    op.drop_table("session_key_rules")
    op.drop_table("entity_merges")
    op.drop_index("ix_entity_aliases_entity_id", table_name="entity_aliases")
    op.drop_index("ix_entity_aliases_session_id_core_key", table_name="entity_aliases")
    op.drop_table("entity_aliases")
