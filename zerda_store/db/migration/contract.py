"""The contract step of an upgrade (``zerda-store db contract``): drop what the schema keeps
only for the previous release, once no server of it runs and ``db rekey`` has given what
those servers saved the keys of the new rules.

``db upgrade`` gives two columns a default that the new release never relies on (it writes
both) and the previous release needs, as it does not know them: ``contexts.created_at``
(now) and ``entities.core_key`` (empty: an entity that ``db rekey`` has not re-keyed yet).
Once they are dropped, a server of the previous release that was left running fails to
save (NOT NULL) instead of saving entities that the new rules do not find. Both the
schema with the defaults and the one without are current (``db check`` accepts either).

Refused, changing nothing, while entities without a core remain (``db rekey`` first), and
at a revision other than head (``db upgrade`` first). It raises the schema's compatibility
floor (:mod:`.compatibility`) in the same transaction: a process of a release before
revision 0006 that checks the floor then refuses to start, naming this step. On Postgres the defaults are dropped
in one short transaction that takes the tables' locks in the order saves do, waits
briefly for them and tries again after a lock timeout or a deadlock (see
:mod:`migration.lock_waits`); on SQLite the defaults are taken out of the tables'
definitions in one short transaction, without copying the tables
(:mod:`migration.sqlite_schema`; a definition it does not recognise is rebuilt instead,
the views that read it dropped and made again).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ...errors import LockTimeoutError, ReadOnlyStoreError, SchemaNotCurrentError
from ..store import StoreCore
from . import sqlite_schema
from .compatibility import CONTRACT_FLOOR, CONTRACT_REASON, CONTRACT_STEP, raise_floor
from .lock import alembic_connection, locked_connection
from .lock_waits import retrying_lock_timeouts, short_lock_waits

# (table, column, type): the defaults kept for the previous release only.
COMPATIBILITY_DEFAULTS: tuple[tuple[str, str, Any], ...] = (
    ("contexts", "created_at", sa.Double()),
    ("entities", "core_key", sa.Text()),
)
# The order a save takes the tables' locks (the turn, its entities, their snippets, its ledger
# row: :meth:`turns.repository.Repository.turn_save`). Each ALTER takes its table's
# exclusive lock, so the contract takes them in this order too: the other order deadlocked
# with the saves (on Citus, a distributed deadlock over the shards' locks).
SAVE_LOCK_ORDER = ("session_key_rules", "turns", "entities", "contexts", "extractions")
UNKEYED = "SELECT COUNT(*), COUNT(DISTINCT session_id) FROM entities WHERE core_key = ''"


def contract(store: StoreCore, head: str, current: str) -> list[str]:
    """Drop the compatibility defaults still there; returns them as ``table.column``."""
    store.check_writable()
    if current != head:
        raise SchemaNotCurrentError(
            f"cannot contract: the database is at revision {current}, not {head}; run "
            "`zerda-store db upgrade` first"
        )
    with store.connect() as connection:
        _refuse_unkeyed(connection)  # before any lock: the usual refusal waits for nothing
        connection.rollback()
    if store.dialect == "postgresql":
        return _contract_postgres(store)
    try:
        with alembic_connection(store, locked=True, wait_ms=SQLITE_WAIT_MS) as connection:
            _refuse_unkeyed(connection)
            return _contract_sqlite(connection)
    except DBAPIError as exc:
        raise _sqlite_refusal(store, exc) from None


# How long `db contract` waits on SQLite for another writer (a save, another migration):
# saves are short, and an operator is told rather than kept waiting ten minutes.
SQLITE_WAIT_MS = 30_000


def _sqlite_refusal(store: StoreCore, exc: DBAPIError) -> Exception:
    """A SQLite file that cannot be written, or a write lock not had in time, as the
    refusal that says so (nothing was changed: the transaction rolled back)."""
    detail = str(exc.orig).lower()
    if "readonly" in detail or "read-only" in detail:
        return ReadOnlyStoreError(
            f"{store.location} cannot be written (a read-only file or folder): db contract "
            "changes the schema; nothing was changed"
        )
    if "locked" in detail or "busy" in detail:
        return LockTimeoutError(
            f"db contract waited {SQLITE_WAIT_MS / 1000:g} s for another writer of "
            f"{store.location} (a long write or another migration); nothing was changed: "
            "run it again when that is done"
        )
    return exc


def _refuse_unkeyed(connection: Connection) -> None:
    entities, sessions = connection.exec_driver_sql(UNKEYED).one()
    if entities:
        raise SchemaNotCurrentError(
            f"cannot contract: {entities} entities of {sessions} sessions, saved by servers "
            "of the previous release, have no keys of the new rules yet: run "
            "`zerda-store db rekey` first (once the last of those servers has stopped)"
        )


def _with_default(connection: Connection) -> list[tuple[str, str, Any]]:
    inspector = sa.inspect(connection)
    found = []
    for table, column, type_ in COMPATIBILITY_DEFAULTS:
        columns = {c["name"]: c for c in inspector.get_columns(table)}
        if columns[column].get("default") is not None:
            found.append((table, column, type_))
    return found


def _contract_postgres(store: StoreCore) -> list[str]:
    dropped: list[str] = []
    with locked_connection(store, per_revision=True) as connection:

        def run() -> None:
            with connection.begin():
                dropped[:] = _drop_postgres(connection)

        with short_lock_waits(connection):
            retrying_lock_timeouts(connection, run, lambda: "db contract")
    return dropped


def _drop_postgres(connection: Connection) -> list[str]:
    found = _with_default(connection)
    for table, column, _ in sorted(found, key=lambda default: SAVE_LOCK_ORDER.index(default[0])):
        connection.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {column} DROP DEFAULT")
    dropped = [f"{table}.{column}" for table, column, _ in found]
    # Under the tables' locks now: no server of the previous release saves in between.
    _refuse_unkeyed(connection)
    _raise_floor(connection)
    return dropped


def _raise_floor(connection: Connection) -> None:
    """Record that releases before the one writing both columns can no longer run here
    (in the contract's transaction: the floor rises exactly when the defaults go)."""
    raise_floor(connection, CONTRACT_STEP, CONTRACT_FLOOR, CONTRACT_REASON, time.time())


def _contract_sqlite(connection: Connection) -> list[str]:
    found = _with_default(connection)
    _raise_floor(connection)
    if not found:
        return []
    if sqlite_schema.drop_defaults(connection, [(table, column) for table, column, _ in found]):
        return [f"{table}.{column}" for table, column, _ in found]
    return _rebuild_sqlite(connection, found)


def _rebuild_sqlite(connection: Connection, found: list[tuple[str, str, Any]]) -> list[str]:
    """The tables rebuilt without the defaults: for a table whose definition the quick
    path does not recognise (it holds the write lock while the tables are copied)."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    views: Sequence[Any] = connection.exec_driver_sql(
        "SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY name"
    ).all()
    for name, _ in views:
        connection.exec_driver_sql(f'DROP VIEW "{name}"')
    # The rebuilt tables would count their ids on from the highest left, reusing those of
    # merged entities and dropped snippets, which an unmerge puts back: keep the counters.
    counters = connection.exec_driver_sql(
        "SELECT name, seq FROM sqlite_sequence WHERE name IN ('contexts', 'entities')"
    ).all()
    operations = Operations(MigrationContext.configure(connection))
    for table, column, type_ in found:
        # Ids never reused in either table (revision 0007): AUTOINCREMENT kept.
        with operations.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": True}
        ) as batch:
            batch.alter_column(
                column, existing_type=type_, existing_nullable=False, server_default=None
            )
    for name, seq in counters:
        connection.execute(
            sa.text("UPDATE sqlite_sequence SET seq = MAX(seq, :seq) WHERE name = :name"),
            {"seq": seq, "name": name},
        )
    for _, sql in views:
        connection.exec_driver_sql(sql)
    return [f"{table}.{column}" for table, column, _ in found]
