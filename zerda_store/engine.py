"""Database URLs, engines with the right connection settings, and the shared :class:`Store`.

SQLite gets durable commits, a busy timeout, foreign keys, and write transactions that
begin IMMEDIATE (a deferred read-then-write transaction cannot wait for a concurrent writer
and fails with "database is locked"); WAL is switched on where the schema is created
(:mod:`migrate`), never on a file merely opened. Postgres goes through psycopg 3 with pre-ping
and a connect timeout, so a dead server fails in seconds instead of hanging.

A store opened with ``read_only=True`` never writes: SQLite opens the file with ``mode=ro``
(and, in a folder where SQLite cannot create the ``-shm`` file a WAL database needs, with
``immutable=1`` when no ``-wal`` file holds changes); Postgres sessions run with
``default_transaction_read_only``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Dialect, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError

from . import unit_of_work
from .errors import (
    CommitOutcomeUnknownError,
    DatabaseUnavailableError,
    LockTimeoutError,
    ReadOnlyStoreError,
    SchemaNotCurrentError,
    StoreError,
)
from .unit_of_work import SessionLock, Transaction
from .urls import parse_url, safe_url, scrub, secret_query, with_password_from_query

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_DATABASE_URL",
    "CommitOutcomeUnknownError",
    "DatabaseUnavailableError",
    "LockTimeoutError",
    "ReadOnlyStoreError",
    "SchemaNotCurrentError",
    "Store",
    "StoreError",
    "resolve_url",
    "safe_url",
]

logger = logging.getLogger(__name__)

DEFAULT_DATABASE_URL = "sqlite:///zerda_store.db"
DATABASE_URL_ENV = "ZERDA_STORE_DATABASE_URL"
CONNECT_TIMEOUT_SECONDS = 5
# How long a statement waits for a lock another connection holds, by default (seconds):
# Postgres's lock_timeout, SQLite's busy timeout.
DEFAULT_LOCK_TIMEOUT = 5.0
SQLITE_BUSY_TIMEOUT_MS = int(DEFAULT_LOCK_TIMEOUT * 1000)
MIN_SQLITE_VERSION = (3, 35, 0)
# SQLite's extended result code when a read-only connection cannot create the -shm file of a
# WAL database because the folder is not writable (and no -wal file is there).
SQLITE_READONLY_DIRECTORY = 1544
# Marks (in the pool's record of a connection) a SQLite connection opened immutable=1.
IMMUTABLE = "zerda_store_immutable"
# A Postgres schema chosen with ``schema=``: a plain lower-case identifier, so that it goes
# into search_path without quoting.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

Durability = Literal["full", "normal"]
T = TypeVar("T")
C = TypeVar("C")
S = TypeVar("S")

# Driver connections kept between units of work, outside the pool (the pool's others stay
# free for SQLAlchemy's own connections).
KEPT_CONNECTIONS = 4
# A connection idle longer than this goes back to the pool (its recycling and a liveness
# check apply there) instead of being used again directly.
KEPT_SECONDS = 30.0

# Connections a forked child inherited from its parent's stores: referenced for the life
# of the child so that garbage collection never closes the parent's sockets.
_INHERITED: list[Any] = []

# True while a unit of work that runs again whole on a dead connection checks one out: it
# needs no liveness ping first (a round trip on every checkout).
_NO_PING: ContextVar[bool] = ContextVar("zerda_store_no_ping", default=False)


def resolve_url(database_url: str | URL | None = None) -> URL:
    """The URL to use: the argument, else ``ZERDA_STORE_DATABASE_URL``, else the SQLite file.

    ``postgresql://`` and ``postgres://`` URLs are mapped to the psycopg 3 driver. A password
    may hold unencoded ``@`` signs, or come as ``?password=`` (it then becomes the URL's
    password, which is never shown).
    """
    raw = database_url or os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL
    if isinstance(raw, str) and raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://") :]
    try:
        url = parse_url(raw) if isinstance(raw, str) else raw
        url.port  # noqa: B018  (a port that is not a number is found here, not later)
    except (ArgumentError, ValueError):
        raise StoreError(
            "could not parse the database URL; expected e.g. sqlite:///file.db "
            "or postgresql://user@host/dbname"
        ) from None
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "postgresql":
        url = with_password_from_query(url)
    return url


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


def create_store_engine(
    url: URL,
    *,
    durability: Durability = "full",
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    read_only: bool = False,
    schema: str | None = None,
) -> Engine:
    """An engine configured for zerda_store's transactions on SQLite or Postgres; no
    statement waits more than ``lock_timeout`` seconds for a lock. ``read_only`` opens
    connections that cannot write; ``schema`` (Postgres) is put first on the search_path."""
    _check_supported(url)
    if url.get_backend_name() == "sqlite":
        if schema is not None:
            raise StoreError("schema= applies to Postgres only: a SQLite file has no schemas")
        return _sqlite_engine(url, durability, lock_timeout, read_only)
    # Session settings rather than startup options: the URL's options, PGOPTIONS and
    # poolers that refuse startup options (PgBouncer) are left alone.
    settings = [f"SET lock_timeout = {_milliseconds(lock_timeout)}"]
    if read_only:
        settings.append("SET default_transaction_read_only = on")
    if schema is not None:
        settings.append(f"SET search_path = {checked_schema(schema)}")
    connect_args: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_SECONDS,
        # A peer that vanishes mid-statement is noticed in about half a minute, not after
        # the operating system's TCP timeout.
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    # Secrets of the query (sslpassword=...) go to the driver beside the URL, not in it:
    # SQLAlchemy shows an engine's URL, query and all, in its repr and logs.
    secrets = secret_query(url)
    connect_args.update(secrets)
    url = url.difference_update_query(secrets)
    engine = sa.create_engine(url, pool_recycle=1800, connect_args=connect_args)
    _ping_on_checkout(engine)

    @event.listens_for(engine, "connect")
    def _apply_settings(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            for setting in settings:
                cursor.execute(setting)
        dbapi_connection.commit()

    return engine


def _milliseconds(seconds: float) -> int:
    """Whole milliseconds, at least 1 (0 would mean "wait forever" to Postgres)."""
    return max(1, math.ceil(seconds * 1000))


def checked_schema(schema: str) -> str:
    """``schema`` if it is a plain lower-case Postgres identifier, else a ValueError."""
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(
            f"schema must be a lower-case Postgres identifier (letters, digits, _), got {schema!r}"
        )
    return schema


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


def _sqlite_engine(
    url: URL, durability: Durability, lock_timeout: float, read_only: bool
) -> Engine:
    synchronous = {"full": "FULL", "normal": "NORMAL"}[durability]
    busy_timeout_ms = _milliseconds(lock_timeout)
    engine = sa.create_engine(url, connect_args={"timeout": lock_timeout})

    if read_only:
        if url.query.get("uri"):
            raise StoreError(
                "read_only= takes a plain sqlite:///PATH URL, not a file: URI "
                "(with a URI, put mode=ro in it yourself)"
            )
        path = Path(str(url.database)).absolute()

        @event.listens_for(engine, "do_connect")
        def _open(dialect: Dialect, record: Any, _cargs: Any, cparams: dict[str, Any]) -> Any:
            connection, record.info[IMMUTABLE] = _open_read_only(
                dialect.loaded_dbapi, path, cparams
            )
            return connection

        @event.listens_for(engine, "checkin")
        def _once(_dbapi_connection: Any, record: Any) -> None:
            # An immutable connection would never see a writer that starts later: each
            # checkout opens (and probes) a new one.
            if record.info.get(IMMUTABLE):
                record.invalidate()

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        if mode is not None:  # None: one statement in the driver's autocommit mode
            connection.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _open_read_only(dbapi: Any, path: Path, cparams: dict[str, Any]) -> tuple[Any, bool]:
    """A connection to ``path`` that cannot write and creates no file but, for a WAL
    database, the ``-shm`` and ``-wal`` files SQLite needs to read it; and whether it was
    opened ``immutable=1``.

    Where the folder is not writable and the file has no ``-shm``, ``mode=ro`` cannot read a
    WAL database (SQLite needs to create the ``-shm``). With no ``-wal`` file either, every
    committed change is in the main file, so it is opened ``immutable=1`` instead: SQLite
    then reads it without locks or a ``-shm``. A ``-wal`` file without its ``-shm`` holds
    changes that only a writable folder lets SQLite read: that is refused, not read stale.
    An immutable connection takes no locks and does not notice a writer that starts while
    it is open, so it serves one unit of work or query only.
    """
    options = {key: value for key, value in cparams.items() if key != "uri"}
    connection = dbapi.connect(f"{path.as_uri()}?mode=ro", uri=True, **options)
    try:
        connection.execute("PRAGMA schema_version")  # reads the file: WAL needs the -shm here
        return connection, False
    except sqlite3.OperationalError as exc:
        connection.close()
        if getattr(exc, "sqlite_errorcode", None) == SQLITE_READONLY_DIRECTORY:
            logger.info("reading %s as immutable: its folder is read-only", path)
            immutable = f"{path.as_uri()}?mode=ro&immutable=1"
            return dbapi.connect(immutable, uri=True, **options), True
        if Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists():
            raise sqlite3.OperationalError(
                f"{exc}: it has a -wal file of changes not yet in the main file but no -shm "
                "file, which SQLite cannot create in a read-only folder; open it once where "
                "you can write (that folds the -wal file in), or copy the files elsewhere"
            ) from exc
        raise


def first_line(exc: BaseException) -> str:
    """The first line of a driver error (SQLAlchemy's wrapper adds the statement and a
    link), as it came, secrets and all: pass it through :func:`scrub` before showing it."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return detail[0] if detail else type(exc).__name__


class Store:
    """One engine (one connection pool) and one set of compiled statements that many
    memories can share.

    ``lock_timeout`` (seconds) bounds how long a statement waits for a lock another
    connection holds; past it the call raises :class:`LockTimeoutError`. Use the store as
    a context manager or call :meth:`close`; closing never deletes data.

    ``read_only=True`` opens the database for reading only: it is never created, migrated
    or written (a SQLite file that is not there is a :class:`DatabaseUnavailableError`, a
    write a :class:`ReadOnlyStoreError`). ``schema`` (Postgres) names the schema that holds
    zerda_store's tables (it goes first on the connections' search_path; ``db upgrade``
    creates it if needed).
    """

    def __init__(
        self,
        database_url: str | URL | None = None,
        *,
        durability: Durability = "full",
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        read_only: bool = False,
        schema: str | None = None,
    ):
        if not lock_timeout > 0:
            raise ValueError(
                f"lock_timeout must be a positive number of seconds, got {lock_timeout}"
            )
        self.url = resolve_url(database_url)
        self.lock_timeout = float(lock_timeout)
        self.read_only = read_only
        self.schema = checked_schema(schema) if schema is not None else None
        self._statements: dict[Callable[[Dialect], Any], Any] = {}
        self._statements_lock = threading.Lock()
        self._idle: list[tuple[Any, float]] = []
        self._pid = os.getpid()
        try:
            self.engine = create_store_engine(
                self.url,
                durability=durability,
                lock_timeout=self.lock_timeout,
                read_only=read_only,
                schema=self.schema,
            )
        except (ArgumentError, ImportError, ValueError) as exc:
            raise StoreError(
                f"cannot use the database URL {safe_url(self.url)}: "
                f"{scrub(str(exc), self.url)}; zerda_store runs on sqlite:/// and postgresql:// URLs"
            ) from None
        self.dialect = self.engine.dialect.name
        if read_only:
            self.require_file()
        event.listen(self.engine, "engine_disposed", self._drop_kept)
        self.schema_checked = False
        self.schema_lock = threading.Lock()
        self.closed = False
        self._sweeper: Any = None

    def __repr__(self) -> str:
        return f"Store({safe_url(self.url)!r})"

    @property
    def location(self) -> str:
        """Where the database is, for messages: the SQLite file's path, else the URL
        without its password."""
        return str(self.url.database) if self.dialect == "sqlite" else safe_url(self.url)

    def require_file(self) -> None:
        """Raise :class:`DatabaseUnavailableError` if this is a SQLite file that is not
        there (opening it would create an empty database)."""
        if self.dialect == "sqlite" and not Path(str(self.url.database)).is_file():
            raise DatabaseUnavailableError(f"no database file at {self.url.database}")

    def check_writable(self) -> None:
        """Raise :class:`ReadOnlyStoreError` if this store was opened read-only."""
        if self.read_only:
            raise ReadOnlyStoreError(
                f"{self.location} is open read-only: nothing was written "
                "(open it without read_only / --read-only to change it)"
            )

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the pool's connections (stopping the sweeper first, if it runs); the store
        cannot be used afterwards."""
        self.stop_sweeper()
        self.closed = True
        self.drop_connections()

    # The retention sweeper lives in zerda_store.pruning, above this module: imported when
    # started, so that a store without one never loads it.

    def start_sweeper(
        self, interval: float = 3600.0, *, now: Callable[[], float] = time.time
    ) -> None:
        """Start a daemon thread that prunes every session with a retention policy every
        ``interval`` seconds (each round in batches, like ``prune``), until
        :meth:`stop_sweeper` or :meth:`close`. Off unless started; errors are logged."""
        from .pruning import Pruner
        from .sweeper import Sweeper

        if self._sweeper is not None and self._sweeper.running:
            raise StoreError("the sweeper is already running; stop it first")
        self._sweeper = Sweeper(Pruner(self, now=now), interval)
        self._sweeper.start()

    def stop_sweeper(self, timeout: float | None = None) -> None:
        """Stop the sweeper (if it runs) and wait for its current round to finish."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.stop(timeout)

    @property
    def sweeper(self) -> Any:
        """The running sweeper (its ``rounds`` and ``last_receipt``), or None."""
        return self._sweeper

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
    def query(self) -> Iterator[Connection]:
        """A SQLAlchemy connection in a read transaction, rolled back at the end, for the
        operators' queries (on SQLite one snapshot; on Postgres, at READ COMMITTED, each
        statement sees its own)."""
        with self.connect() as connection, connection.begin():
            yield connection

    def write(self, work: Callable[[Transaction], T], lock: SessionLock | None = None) -> T:
        """Run ``work`` as one write transaction (:func:`unit_of_work.write`)."""
        self.check_writable()
        return unit_of_work.write(self, work, lock)

    def read(self, work: Callable[[Transaction], T], *, snapshot: bool = False) -> T:
        """Run ``work``, reads only (:func:`unit_of_work.read`)."""
        return unit_of_work.read(self, work, snapshot=snapshot)

    def borrow(self) -> Any:
        """A driver connection for one attempt of a unit of work: one that an earlier unit
        gave back, else one from the pool. No liveness ping: a unit of work meets a dead
        connection at its first statement and runs again."""
        if self._pid != os.getpid():
            self._after_fork()
        if not self.closed:
            try:
                connection, kept_at = self._idle.pop()
            except IndexError:
                pass
            else:
                if time.monotonic() - kept_at < KEPT_SECONDS:
                    return connection
                # Back to the pool, and out again with its recycling and liveness ping.
                connection.close()
                return self._checked_out(self.engine.raw_connection, ping=True)
        return self._checked_out(self.engine.raw_connection, ping=False)

    def give_back(self, connection: Any, *, reusable: bool) -> None:
        """Keep a connection a unit of work left with no transaction open for the next one
        (skipping the pool's checkin, reset and checkout, a fifth of a recall's time on
        SQLite); otherwise return it to the pool, which rolls back what is left open."""
        reusable = reusable and not connection.info.get(IMMUTABLE)
        if reusable and not self.closed and len(self._idle) < KEPT_CONNECTIONS:
            self._idle.append((connection, time.monotonic()))
            if self.closed:  # closed meanwhile
                self.drop_connections()
            return
        connection.close()

    def connections_in_use(self) -> int:
        """How many of the pool's connections are in use right now (kept idle ones are
        not: any unit of work may take them)."""
        return int(self.engine.pool.checkedout()) - len(self._idle)  # type: ignore[attr-defined]

    def drop_connections(self) -> None:
        """Close every connection, kept or pooled (after a lost one, the others are most
        likely gone with it, as SQLAlchemy assumes on its own path)."""
        self.engine.dispose()  # the engine_disposed listener drops the kept ones

    def _after_fork(self) -> None:
        """In a forked child: never use, close or return the parent's connections (their
        sockets and files are the parent's); keep them referenced so that nothing closes
        them, and start a pool of the child's own."""
        _INHERITED.append(self._idle)
        self._idle, self._pid = [], os.getpid()
        self.engine.dispose(close=False)

    def _drop_kept(self, *_: object) -> None:
        if self._pid != os.getpid():
            self._after_fork()
            return
        while self._idle:
            try:
                connection, _kept_at = self._idle.pop()
            except IndexError:
                break
            connection.invalidate()

    def describe(self, exc: BaseException) -> str:
        """The first line of a driver error, with every form of this store's secrets masked."""
        return scrub(first_line(exc), self.url)

    def unavailable(self, exc: BaseException) -> DatabaseUnavailableError:
        """The error to raise when the database cannot be reached."""
        return DatabaseUnavailableError(
            f"cannot connect to {safe_url(self.url)}: {self.describe(exc)}"
        )

    def statements(self, factory: Callable[[Dialect], S]) -> S:
        """The statements ``factory`` compiles for this store's dialect: made once per
        store and shared by every memory on it, so that compiling never happens inside a
        transaction after the first use."""
        made = self._statements.get(factory)
        if made is None:
            with self._statements_lock:
                made = self._statements.get(factory)
                if made is None:
                    made = self._statements[factory] = factory(self.engine.dialect)
        return cast(S, made)

    @property
    def safe_url(self) -> str:
        """This store's URL as messages show it, with every secret masked."""
        return safe_url(self.url)

    def lock_timeout_error(self, exc: BaseException) -> LockTimeoutError:
        """The error to raise when a statement waited ``lock_timeout`` for a lock."""
        return LockTimeoutError(
            f"gave up after waiting {self.lock_timeout:g} s for a lock on {safe_url(self.url)} "
            f"that another connection holds ({self.describe(exc)}); nothing was written. "
            "Find the holder (Postgres: pg_locks / pg_stat_activity) or raise lock_timeout="
        )
