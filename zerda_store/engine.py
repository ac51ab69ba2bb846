"""Database URLs, engines with the right connection settings, and the shared :class:`Store`.

SQLite gets WAL, durable commits, a busy timeout, foreign keys, and write transactions that
begin IMMEDIATE (a deferred read-then-write transaction cannot wait for a concurrent writer
and fails with "database is locked"). Postgres goes through psycopg 3 with pre-ping and a
connect timeout, so a dead server fails in seconds instead of hanging.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from .driver import DriverCursor

logger = logging.getLogger(__name__)

DEFAULT_DATABASE_URL = "sqlite:///zerda_store.db"
DATABASE_URL_ENV = "ZERDA_STORE_DATABASE_URL"
CONNECT_TIMEOUT_SECONDS = 5
SQLITE_BUSY_TIMEOUT_MS = 5000
WRITE_ATTEMPTS = 4
MIN_SQLITE_VERSION = (3, 35, 0)

Durability = Literal["full", "normal"]
T = TypeVar("T")
C = TypeVar("C")

# Postgres SQLSTATEs after which the whole transaction was rolled back and may be run again.
_RETRYABLE_SQLSTATES = {"40P01", "40001"}

# True while a unit of work that runs again whole on a dead connection checks one out: it
# needs no liveness ping first (a round trip on every checkout).
_NO_PING: ContextVar[bool] = ContextVar("zerda_store_no_ping", default=False)


class StoreError(Exception):
    """Base class of the errors zerda_store raises about its database."""


class DatabaseUnavailableError(StoreError):
    """The database cannot be reached or opened."""


class CommitOutcomeUnknownError(StoreError):
    """The connection was lost while committing, so whether the write landed is unknown."""


class _LostCommit(Exception):
    """Raised inside one attempt: the connection died during COMMIT."""

    def __init__(self, error: DBAPIError) -> None:
        super().__init__(str(error))
        self.error = error


class SchemaNotCurrentError(StoreError):
    """The database schema is not at the revision this version of zerda_store needs."""


def resolve_url(database_url: str | URL | None = None) -> URL:
    """The URL to use: the argument, else ``ZERDA_STORE_DATABASE_URL``, else the SQLite file.

    ``postgresql://`` and ``postgres://`` URLs are mapped to the psycopg 3 driver.
    """
    raw = database_url or os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL
    if isinstance(raw, str) and raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://") :]
    try:
        url = make_url(raw)
        url.port  # noqa: B018  (a port that is not a number is found here, not later)
    except (ArgumentError, ValueError):
        raise StoreError(
            "could not parse the database URL; expected e.g. sqlite:///file.db "
            "or postgresql://user@host/dbname"
        ) from None
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


def safe_url(url: URL) -> str:
    """The URL as text with any password masked, for messages and logs."""
    return url.render_as_string(hide_password=True)


def _check_supported(url: URL) -> None:
    backend, driver = url.get_backend_name(), url.get_driver_name()
    if backend == "postgresql" and driver != "psycopg":
        raise StoreError(
            f"the {driver} driver is not supported: use a postgresql:// or "
            "postgresql+psycopg:// URL (pip install 'zerda-store[postgres]')"
        )
    if backend == "sqlite" and url.database in (None, "", ":memory:"):
        raise StoreError(
            "an in-memory SQLite database is not supported (each connection would see its "
            "own empty database): use a file, e.g. sqlite:///memory.db in a temporary folder"
        )
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(
            f"unsupported database {backend!r}: zerda_store runs on SQLite and Postgres"
        )
    if backend == "sqlite" and sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        raise StoreError(
            f"SQLite {sqlite3.sqlite_version} is too old: zerda_store needs 3.35 or newer "
            "(for INSERT ... ON CONFLICT ... RETURNING)"
        )


def create_store_engine(url: URL, *, durability: Durability = "full") -> Engine:
    """An engine configured for zerda_store's transactions on SQLite or Postgres."""
    _check_supported(url)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, durability)
    connect_args: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_SECONDS,
        # A peer that vanishes mid-statement is noticed in about half a minute, not after
        # the operating system's TCP timeout.
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    engine = sa.create_engine(url, pool_recycle=1800, connect_args=connect_args)
    _ping_on_checkout(engine)
    return engine


def _ping_on_checkout(engine: Engine) -> None:
    """``pool_pre_ping``, skipped for :meth:`Store.run_write` and the driver-level units of work:
    they meet a dead connection at their first statement and run again whole."""

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if _NO_PING.get():
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise sa.exc.DisconnectionError() from exc  # the pool takes another connection


def _sqlite_engine(url: URL, durability: Durability) -> Engine:
    synchronous = {"full": "FULL", "normal": "NORMAL"}[durability]
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _switch_to_wal(cursor)
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        if mode is not None:  # None: one statement in the driver's autocommit mode
            connection.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _switch_to_wal(cursor: Any) -> None:
    """WAL is a property of the file: switch once, not on every connection. The switch
    needs a lock that SQLite does not wait for, so a process that opens a new file while
    another is switching or migrating it tries again for a while."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _is_retryable(exc: DBAPIError) -> bool:
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return sqlstate in _RETRYABLE_SQLSTATES or exc.connection_invalidated


class Store:
    """One engine (one connection pool) that many memories can share.

    Use it as a context manager or call :meth:`close`; closing never deletes data.
    """

    def __init__(self, database_url: str | URL | None = None, *, durability: Durability = "full"):
        self.url = resolve_url(database_url)
        try:
            self.engine = create_store_engine(self.url, durability=durability)
        except (ArgumentError, ImportError, ValueError) as exc:
            raise StoreError(
                f"cannot use the database URL {safe_url(self.url)}: {exc}; "
                "zerda_store runs on sqlite:/// and postgresql:// URLs"
            ) from None
        self.dialect = self.engine.dialect.name
        self.schema_checked = False
        self.schema_lock = threading.Lock()
        self.closed = False

    def __repr__(self) -> str:
        return f"Store({safe_url(self.url)!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the pool's connections; the store cannot be used afterwards."""
        self.closed = True
        self.engine.dispose()

    @contextmanager
    def connect(self, *, ping: bool = True) -> Iterator[Connection]:
        """A connection, with connection failures reported as :class:`DatabaseUnavailableError`.

        ``ping=False`` skips the Postgres liveness check, for callers that run again whole
        when the connection turns out dead."""
        with self._checked_out(self.engine.connect, ping=ping) as connection:
            yield connection

    def _checked_out(self, open_connection: Callable[[], C], *, ping: bool) -> C:
        if self.closed:
            raise StoreError("this store is closed")
        token = _NO_PING.set(not ping)
        try:
            return open_connection()
        # A pool's raw connection reports the driver's own error, not SQLAlchemy's.
        except (DBAPIError, self.engine.dialect.loaded_dbapi.Error) as exc:
            raise self.unavailable(exc) from None
        finally:
            _NO_PING.reset(token)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection in a read transaction, rolled back at the end (on SQLite one
        snapshot; on Postgres, at READ COMMITTED, each statement sees its own)."""
        with self.connect() as connection, connection.begin():
            yield connection

    def run_write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one write transaction, again from scratch after a deadlock,
        a serialization failure or a connection lost before the commit.

        A connection lost during the COMMIT itself is not retried: the server may have
        committed, so running the work again could store it twice.
        """

        def attempt() -> T:
            work_done = False
            try:
                with self.connect(ping=False) as connection:
                    connection.execution_options(sqlite_begin="IMMEDIATE")
                    with connection.begin():
                        result = work(connection)
                        work_done = True
                return result
            except DBAPIError as exc:
                if work_done and exc.connection_invalidated:
                    raise _LostCommit(exc) from exc
                raise

        return self._with_retries(attempt, _is_retryable)

    def run_driver_write(self, work: Callable[[DriverCursor], T]) -> T:
        """:meth:`run_write` for compiled statements on the driver's cursor
        (:mod:`zerda_store.driver`): the same transaction, retries and errors."""
        return self._with_retries(lambda: self._on_driver(work, write=True), _is_retryable)

    def run_driver_read(self, work: Callable[[DriverCursor], T]) -> T:
        """Run ``work``, one read statement, outside an explicit transaction (a single
        statement is atomic and sees one snapshot by itself; on Postgres this saves the
        round trips of BEGIN and COMMIT); again on a fresh connection if the pooled one
        turned out dead."""
        return self._with_retries(
            lambda: self._on_driver(work, write=False), lambda exc: exc.connection_invalidated
        )

    def _with_retries(self, attempt: Callable[[], T], retryable: Callable[[DBAPIError], bool]) -> T:
        for number in range(1, WRITE_ATTEMPTS + 1):
            try:
                return attempt()
            except _LostCommit as lost:
                raise CommitOutcomeUnknownError(
                    f"the connection to {safe_url(self.url)} was lost during a commit: "
                    "the write may or may not be stored (pass idempotency_key= to make "
                    "a retry safe)"
                ) from lost.error
            except DBAPIError as exc:
                if number == WRITE_ATTEMPTS or not retryable(exc):
                    raise
                logger.warning("running a unit of work again after %s", type(exc.orig).__name__)
                # Two turns that just deadlocked should not collide again at once.
                time.sleep(random.uniform(0, 0.01 * 2**number))
        raise AssertionError("unreachable")

    def _on_driver(self, work: Callable[[DriverCursor], T], *, write: bool) -> T:
        """One attempt of ``work`` on a pooled driver connection. Driver errors come out
        as SQLAlchemy's :class:`DBAPIError` subclasses, as on the Core path; after a lost
        connection the pool's other connections are dropped too (they are most likely
        gone with it, as SQLAlchemy assumes on its own path)."""
        dialect = self.engine.dialect
        connection = self._checked_out(self.engine.raw_connection, ping=False)
        cursor = None
        autocommit = not write and self.dialect == "postgresql"
        committing = False
        try:
            if autocommit:
                connection.dbapi_connection.autocommit = True  # type: ignore[union-attr]
            cursor = connection.cursor()
            driver = DriverCursor(dialect, cursor)
            if write and self.dialect == "sqlite":
                # A deferred BEGIN cannot wait for another writer once it reads.
                driver.execute_sql("BEGIN IMMEDIATE")
            result = work(driver)
            if write:
                committing = True
                dialect.do_commit(connection)
            return result
        except dialect.loaded_dbapi.Error as orig:
            lost = dialect.is_disconnect(orig, connection.dbapi_connection, cursor)
            if lost:
                connection.invalidate(orig)
                self.engine.dispose()
            error = cast(
                DBAPIError,
                DBAPIError.instance(
                    None,
                    None,
                    orig,
                    dialect.loaded_dbapi.Error,
                    connection_invalidated=lost,
                    dialect=dialect,
                ),
            )
            if committing and lost:
                raise _LostCommit(error) from orig
            raise error from orig
        finally:
            self._give_back(connection, cursor, autocommit)

    @staticmethod
    def _give_back(connection: Any, cursor: Any, autocommit: bool) -> None:
        """Return a driver-level connection to the pool, which rolls back whatever the
        attempt left open; one that cannot be reset is dropped instead."""
        try:
            if cursor is not None:
                cursor.close()
            if autocommit and connection.is_valid:
                connection.dbapi_connection.autocommit = False
        except Exception as exc:
            connection.invalidate(exc)
        finally:
            connection.close()

    def describe(self, exc: BaseException) -> str:
        """The first line of a driver error, with this store's password masked."""
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        reason = detail[0] if detail else type(exc).__name__
        if self.url.password:
            reason = reason.replace(str(self.url.password), "***")
        return reason

    def unavailable(self, exc: BaseException) -> DatabaseUnavailableError:
        """The error to raise when the database cannot be reached."""
        return DatabaseUnavailableError(
            f"cannot connect to {safe_url(self.url)}: {self.describe(exc)}"
        )
