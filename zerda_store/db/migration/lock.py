"""The connection a migration runs on: one transaction that only one migrating process holds
at a time (an advisory lock on Postgres; SQLite's write lock), with SQLite's foreign keys
off for the duration and checked before the commit, or (``per_revision``) a lock held
outside transactions so that Alembic commits each revision on its own: on Postgres a
session-level advisory lock, on SQLite a lock on a file beside the database (SQLite has no
lock that outlives a transaction), which every SQLite migration takes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ...errors import LockTimeoutError, SchemaNotCurrentError, StoreError
from ..store import StoreCore, takes_store

try:
    import fcntl
except ImportError:  # Windows: SQLite upgrades run in one transaction there
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    pass

# Alembic is imported where a function needs it: importing zerda_store, or running a
# command that never migrates, does not load it.

# Any constant will do; it only has to be the same in every process that migrates.
_ADVISORY_LOCK_KEY = 0x7A657264  # "zerd"
MIGRATION_WAIT_MS = 600_000


def _raw_sqlite(connection: Connection, pragma: str) -> None:
    connection.connection.driver_connection.execute(pragma)  # type: ignore[union-attr]


@takes_store
@contextmanager
def locked_connection(store: StoreCore, *, per_revision: bool = False) -> Iterator[Connection]:
    """A connection in one transaction that only one migrating process holds at a time.

    On SQLite foreign keys are switched off for the duration (batch migrations copy tables)
    and checked before the commit. ``per_revision``: no transaction around the whole, but
    a lock held outside transactions, so Alembic commits each revision on its own and the
    tables' locks are released between revisions (other connections' reads and writes wait
    for one revision at most, not for the whole upgrade; on SQLite a revision's long data
    steps commit in short transactions too, see :mod:`.sqlite_online`).
    """
    store.check_writable()
    if store.prepared_statements is False:
        raise StoreError(
            f"schema changes cannot go through a transaction-mode pooler ({store.safe_url} was "
            "opened with prepared_statements=false): the migration lock and Alembic's "
            "revisions need one server connection throughout; run zerda-store db with a URL "
            "of the server itself (or of a session-mode pooler)"
        )
    if per_revision and store.dialect == "postgresql":
        with _session_locked_connection(store) as connection:
            yield connection
        return
    if per_revision and commits_per_revision(store):
        with _sqlite_per_revision_connection(store) as connection:
            yield connection
        return
    with alembic_connection(store, locked=True) as connection:
        yield connection


@contextmanager
def _session_locked_connection(store: StoreCore) -> Iterator[Connection]:
    """A Postgres connection outside any transaction that holds the migration advisory
    lock for its session, waiting long for it (another deploy job may be migrating).

    It waits by trying again, outside any transaction: a process blocked in a statement
    holds a snapshot, which the other's CREATE INDEX CONCURRENTLY would wait for."""
    with store.connect() as connection:
        previous = connection.exec_driver_sql("SHOW lock_timeout").scalar()
        connection.exec_driver_sql(f"SET lock_timeout = {MIGRATION_WAIT_MS}")
        connection.commit()
        deadline = time.monotonic() + MIGRATION_WAIT_MS / 1000
        try_lock = text("SELECT pg_try_advisory_lock(:key)")
        while not connection.execute(try_lock, {"key": _ADVISORY_LOCK_KEY}).scalar():
            connection.commit()
            if time.monotonic() > deadline:
                raise LockTimeoutError(
                    f"another process has been migrating {store.safe_url} for "
                    f"{MIGRATION_WAIT_MS // 1000} s: waited for it, gave up"
                )
            time.sleep(0.2)
        connection.commit()
        try:
            yield connection
        finally:
            try:
                if connection.in_transaction():
                    connection.rollback()
                connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": _ADVISORY_LOCK_KEY}
                )
                connection.execute(
                    text("SELECT set_config('lock_timeout', :v, false)"), {"v": previous}
                )
                connection.commit()
            except Exception:
                # A connection that may still hold the lock must not go back to the pool.
                connection.invalidate()
                raise


def commits_per_revision(store: StoreCore) -> bool:
    """Whether a ``per_revision`` connection of this store commits each revision on its
    own (everywhere but on SQLite where files cannot be locked)."""
    return store.dialect == "postgresql" or fcntl is not None


@contextmanager
def _sqlite_per_revision_connection(store: StoreCore) -> Iterator[Connection]:
    """A SQLite connection outside any transaction, holding the migration's file lock, with
    foreign keys off (checked once the revisions are done, in a read that blocks nobody),
    whose transactions begin IMMEDIATE and wait long for the write lock."""
    with _migration_file_lock(store, MIGRATION_WAIT_MS), store.connect() as connection:
        _raw_sqlite(connection, "PRAGMA foreign_keys=OFF")
        _raw_sqlite(connection, f"PRAGMA busy_timeout={MIGRATION_WAIT_MS}")
        connection.execution_options(sqlite_begin="IMMEDIATE")
        if connection.in_transaction():
            connection.rollback()  # the check-out's ping began one: each revision begins its own
        try:
            yield connection
            if connection.in_transaction():
                connection.commit()
            connection.execution_options(sqlite_begin="DEFERRED")
            with connection.begin():
                _check_foreign_keys(connection)
        finally:
            if connection.in_transaction():
                connection.rollback()
            connection.execution_options(sqlite_begin="DEFERRED")
            _raw_sqlite(connection, "PRAGMA foreign_keys=ON")
            _raw_sqlite(connection, f"PRAGMA busy_timeout={round(store.lock_timeout * 1000)}")


def _check_foreign_keys(connection: Connection) -> None:
    problems = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if problems:
        raise SchemaNotCurrentError(f"migration broke foreign keys: {problems[:5]}")


def _lock_file(store: StoreCore) -> str:
    """The file whose lock a SQLite migration holds: beside the database, removed after."""
    return f"{store.url.database}-migrating"


@contextmanager
def _migration_file_lock(store: StoreCore, wait_ms: int) -> Iterator[None]:
    """Hold the lock of :func:`_lock_file` (waiting for another migrating process at most
    ``wait_ms``); the operating system releases it when a process dies. Without file locks
    (Windows) nothing is held: there, the IMMEDIATE transaction of a whole migration is
    the lock."""
    if fcntl is None:
        yield
        return
    path = _lock_file(store)
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            if time.monotonic() > deadline:
                raise LockTimeoutError(
                    f"another process has been migrating {store.location} for "
                    f"{wait_ms // 1000} s: waited for it, gave up"
                ) from None
            time.sleep(0.1)
            continue
        if _same_file(descriptor, path):
            break
        os.close(descriptor)  # removed by the process that held it: lock the new one
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            os.unlink(path)
        os.close(descriptor)


def _same_file(descriptor: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False


@contextmanager
def alembic_connection(
    store: StoreCore, *, locked: bool, wait_ms: int = MIGRATION_WAIT_MS
) -> Iterator[Connection]:
    """A connection in one transaction for Alembic (whose env.py wants SQLite's foreign keys
    off); ``locked``: a write transaction that one migrating process holds at a time,
    waited for at most ``wait_ms`` on SQLite."""
    with ExitStack() as stack:
        if locked and store.dialect == "sqlite":
            stack.enter_context(_migration_file_lock(store, wait_ms))
        connection = stack.enter_context(store.connect())
        if store.dialect == "sqlite":
            # Outside any transaction, where SQLite honours it; the driver is in autocommit.
            _raw_sqlite(connection, "PRAGMA foreign_keys=OFF")
            if locked:
                # Another process may be rebuilding a large table: wait for it, not 5 s.
                _raw_sqlite(connection, f"PRAGMA busy_timeout={wait_ms}")
                connection.execution_options(sqlite_begin="IMMEDIATE")
        try:
            with connection.begin():
                if locked and store.dialect == "postgresql":
                    # Waiting for another deploy job, or for the locks of running saves, is
                    # expected here: wait long, not the store's lock_timeout.
                    connection.exec_driver_sql(f"SET LOCAL lock_timeout = {MIGRATION_WAIT_MS}")
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK_KEY}
                    )
                yield connection
                if locked and store.dialect == "sqlite":
                    _check_foreign_keys(connection)
        finally:
            if store.dialect == "sqlite":
                _raw_sqlite(connection, "PRAGMA foreign_keys=ON")
                _raw_sqlite(connection, f"PRAGMA busy_timeout={round(store.lock_timeout * 1000)}")
