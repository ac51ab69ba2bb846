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

On Postgres, when the revision runs in transactions of its own (``db upgrade``), nothing
holds the table's lock for long: the tables and the column (nullable, with the default the
previous release's saves take) are committed in one short transaction; each session is
re-keyed in a short transaction of its own holding the session's lock (as ``db rekey``
does); then NOT NULL comes through a check constraint validated first, and the index is
built concurrently. Run so on SQLite, the tables and the column are committed in the revision's
transaction, each session is re-keyed in a short transaction of its own, and ``entities``
is rebuilt with the column NOT NULL and its index in short transactions
(``zerda_store.db.migration.sqlite_online``). Re-run after an interruption, it re-keys the
sessions left (those with entities whose ``core_key`` is NULL) and goes on.

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
from alembic.operations import BatchOperations

from zerda_store.db.migration import sqlite_online

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
            _core_key_required(batch)
    else:
        with op.batch_alter_table("entities", recreate=recreate) as batch:
            batch.drop_index("ix_entities_session_id_core_key")
            batch.drop_column("core_key")
    if sqlite:
        op.execute(ENTITY_OVERVIEW)
        op.execute(ENTITY_SNIPPETS)


def _core_key_required(batch: BatchOperations) -> None:
    # Empty for the entities the previous release saves while both releases run;
    # `zerda-store db rekey` gives them their keys and cores.
    batch.alter_column("core_key", existing_type=sa.Text(), nullable=False, server_default="")
    batch.create_index("ix_entities_session_id_core_key", ["session_id", "core_key"])


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
    _report(
        _frozen("rekeying").rekey_sessions(
            op.get_bind(), time.time(), assume_normalized=attributes.get(ASSUME_NORMALIZED, False)
        )
    )


def _report(outcomes: list[Any]) -> None:
    """Log what the re-keying did, and hand it to `zerda-store db upgrade` to print."""
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
    report = op.get_context().config.attributes.get(REPORT)
    if report is not None:
        report.extend(asdict(outcome) for outcome in outcomes if outcome.key_rules)


# Set by env.py: the revision runs in transactions of its own on Postgres.
ONLINE_DDL = "online_ddl"
# The session locks of the library's saves (`zerda_store.db.execution.unit_of_work`): the re-keying
# of a session excludes the saves of the new release to it, as `db rekey` does.
SESSION_LOCK = "SELECT pg_advisory_xact_lock(2053468787, hashtext(%(session_id)s))"
NOT_NULL_CHECK = "ck_entities_core_key_rekeyed"
CORE_KEY_INDEX = "ix_entities_session_id_core_key"
# A session's re-keying raced by a save of the previous release is run again, this often.
REKEY_TRIES = 3
UNIQUE_VIOLATION = "23505"


def _rekey_committed(
    bind: sa.Connection, rekeying: Any, session_id: str, assume_normalized: Any
) -> Any:
    """Re-key one session in a transaction of its own, holding the session's lock. A save
    of the previous release (which takes no such lock) may commit a key between the
    re-keying's reads and its update, a unique violation: the session is rolled back and
    re-keyed again from the start (``REKEY_TRIES`` times in all)."""
    for attempt in range(1, REKEY_TRIES + 1):
        bind.exec_driver_sql("BEGIN")
        try:
            bind.exec_driver_sql(SESSION_LOCK, {"session_id": session_id})
            outcome = rekeying.rekey_session(
                bind, session_id, time.time(), assume_normalized=assume_normalized
            )
        except sa.exc.IntegrityError as exc:
            bind.exec_driver_sql("ROLLBACK")
            if attempt == REKEY_TRIES or getattr(exc.orig, "sqlstate", None) != UNIQUE_VIOLATION:
                raise
            logger.warning(
                "session %r: a save committed a key while it was re-keyed; re-keying it again",
                session_id,
            )
            continue
        except BaseException:
            bind.exec_driver_sql("ROLLBACK")
            raise
        bind.exec_driver_sql("COMMIT")
        return outcome
    raise AssertionError("unreachable")


def _upgrade_sqlite_online() -> None:
    """SQLite, holding the write lock briefly at a time: the tables and the column (nullable)
    in the revision's transaction; then each session re-keyed in a short transaction of its
    own (SQLite has one writer at a time: no save runs inside it), and ``entities`` rebuilt
    with the column NOT NULL and its index, in short transactions. An entity the previous
    release saves meanwhile without a core takes the default, ``''`` (as on Postgres: `db
    rekey` re-keys it). Re-run after an interruption, it goes on with the sessions not
    re-keyed yet, or the rebuild."""
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if not inspector.has_table("entity_aliases"):
        _create_tables()
    columns = {column["name"]: column for column in inspector.get_columns("entities")}
    if "core_key" not in columns:
        op.add_column("entities", sa.Column("core_key", sa.Text(), nullable=True))
    elif not columns["core_key"]["nullable"]:
        return  # rebuilt by an interrupted run
    assume_normalized = op.get_context().config.attributes.get(ASSUME_NORMALIZED, False)
    with sqlite_online.apart(bind) as pacing:
        rekeying = _frozen("rekeying")
        for session_id in rekeying.pending_sessions(bind):
            with sqlite_online.short_transaction(bind, pacing):
                outcome = rekeying.rekey_session(
                    bind, session_id, time.time(), assume_normalized=assume_normalized
                )
            _report([outcome])  # as it is committed: a later stop loses none of the report
        sqlite_online.rebuild_table(
            bind,
            "entities",
            _core_key_required,
            pacing,
            values={"core_key": "COALESCE({row}.core_key, '')"},
        )


def _upgrade_online() -> None:
    """Postgres, holding no table's lock for long: the tables and the column (nullable,
    with the default the previous release's saves take) in one short transaction; then each
    session re-keyed in a short transaction of its own, holding the session's lock; then
    NOT NULL through a check constraint validated first, and the index built concurrently.
    Re-run after an interruption, it goes on with the sessions not re-keyed yet (their
    entities' ``core_key`` is still NULL)."""
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table("entity_aliases"):
        _create_tables()
    columns = {column["name"]: column for column in inspector.get_columns("entities")}
    if "core_key" not in columns:
        op.add_column("entities", sa.Column("core_key", sa.Text(), nullable=True))
        op.alter_column("entities", "core_key", server_default="")
    context = op.get_context()
    assume_normalized = context.config.attributes.get(ASSUME_NORMALIZED, False)
    with context.autocommit_block():
        bind = op.get_bind()
        rekeying = _frozen("rekeying")
        for session_id in rekeying.pending_sessions(bind):
            outcome = _rekey_committed(bind, rekeying, session_id, assume_normalized)
            _report([outcome])  # as it is committed: a later stop loses none of the report
    if columns.get("core_key", {"nullable": True})["nullable"]:
        op.execute(f"ALTER TABLE entities DROP CONSTRAINT IF EXISTS {NOT_NULL_CHECK}")
        op.execute(
            f"ALTER TABLE entities ADD CONSTRAINT {NOT_NULL_CHECK} "
            "CHECK (core_key IS NOT NULL) NOT VALID"
        )
        with context.autocommit_block():
            op.get_bind().exec_driver_sql(
                f"ALTER TABLE entities VALIDATE CONSTRAINT {NOT_NULL_CHECK}"
            )
        op.execute("ALTER TABLE entities ALTER COLUMN core_key SET NOT NULL")
        op.execute(f"ALTER TABLE entities DROP CONSTRAINT {NOT_NULL_CHECK}")
    with context.autocommit_block():
        # One left invalid by an interrupted run is built again.
        op.get_bind().exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {CORE_KEY_INDEX}")
        op.get_bind().exec_driver_sql(
            f"CREATE INDEX CONCURRENTLY {CORE_KEY_INDEX} ON entities (session_id, core_key)"
        )


def upgrade() -> None:
    if op.get_context().config.attributes.get(ONLINE_DDL):
        if _sqlite():
            _upgrade_sqlite_online()
        else:
            _upgrade_online()
        return
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
