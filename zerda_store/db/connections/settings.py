"""Engines with the right connection settings (the sync and the async calls share one).

SQLite gets durable commits, a busy timeout, foreign keys, and write transactions that
begin IMMEDIATE; a read-only store opens the file ``mode=ro`` (or ``immutable=1`` in a
read-only folder). Postgres gets a connect timeout, keepalives, and its session settings
(lock_timeout, default_transaction_read_only, search_path) as SET statements when each
connection opens; secrets of the URL's query go to the driver beside the URL.

Behind a transaction-mode pooler (PgBouncer's ``pool_mode = transaction``) a client
connection gets another server connection for each transaction, so nothing may outlive a
transaction on the server: a store opened with ``prepared_statements=False`` (or
``?prepared_statements=false`` in its URL) prepares no statement on the server and sends
its settings inside each transaction (``set_config(..., true)``, as ``SET LOCAL``) instead
of once per connection. A store not told either way looks, on each new connection, whether
a pooler stands between it and the server (the backend's process id differs from the one
the connection was given at start-up, which a pooler makes up): it then prepares nothing on
that connection, and says once in the log that the option is needed for its settings to
hold in transaction mode.
"""

from __future__ import annotations

import logging
import math
import re
import sqlite3
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Dialect, Engine

from ...errors import DatabaseUrlError, RefusedValueError, StoreError
from .urls import safe_url, secret_query

logger = logging.getLogger("zerda_store.engine")

CONNECT_TIMEOUT_SECONDS = 5
# How long a call waits for a connection of the store's pool when all are in use (seconds).
DEFAULT_POOL_TIMEOUT = 30.0
# Connections the pool opens beyond its size for sync callers (pool_size is the async
# threads and one more).
POOL_OVERFLOW = 10
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
# The URL query key of the store's ``prepared_statements`` option, and the values it takes.
PREPARED_STATEMENTS = "prepared_statements"
# The URL query key of the store's ``route_to_workers`` option (Citus, :mod:`db.placements`).
ROUTE_TO_WORKERS = "route_to_workers"
_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")

Durability = Literal["full", "normal"]

# Where psycopg comes from: the package is installed from a checkout or a wheel built
# from one (it is not on a package index), with its "postgres" extra.
POSTGRES_EXTRA = (
    "Postgres needs the postgres extra: pip install '.[postgres]' in a checkout, or "
    "pip install 'zerda_store-<version>-py3-none-any.whl[postgres]'"
)

# True while a unit of work that runs again whole on a dead connection checks one out: it
# needs no liveness ping first (a round trip on every checkout).
NO_PING: ContextVar[bool] = ContextVar("zerda_store_no_ping", default=False)


def _check_supported(url: URL) -> None:
    backend, driver = url.get_backend_name(), url.get_driver_name()
    if backend == "postgresql" and driver != "psycopg":
        raise StoreError(
            f"the {driver} driver is not supported: use a postgresql:// or "
            f"postgresql+psycopg:// URL ({POSTGRES_EXTRA})"
        )
    if backend == "sqlite" and url.database in (None, "", ":memory:"):
        raise DatabaseUrlError(
            "an in-memory SQLite database is not supported (each connection would see its "
            "own empty database): use a file, e.g. sqlite:///memory.db in a temporary folder"
        )
    if backend not in ("sqlite", "postgresql"):
        raise DatabaseUrlError(
            f"unsupported database {backend!r}: zerda_store runs on SQLite and Postgres"
        )
    if backend == "sqlite" and sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        raise StoreError(
            f"SQLite {sqlite3.sqlite_version} is too old: zerda_store needs 3.35 or newer "
            "(for INSERT ... ON CONFLICT ... RETURNING)"
        )


def _url_flag(url: URL, key: str) -> bool | None:
    """The URL's ``?key=`` (true or false; the last one given), None if absent."""
    given = url.query.get(key)
    if isinstance(given, tuple):
        given = given[-1]
    if given is None:
        return None
    if given.lower() not in _TRUE + _FALSE:
        raise StoreError(f"{key}= in the database URL takes true or false, got {given!r}")
    return given.lower() in _TRUE


def prepared_statements_option(url: URL, prepared_statements: bool | None) -> bool | None:
    """Whether the store may prepare statements on the server: ``prepared_statements`` if
    given, else the URL's ``?prepared_statements=`` (true or false), else None (yes, unless
    a connection turns out to go through a pooler). Only Postgres has the choice."""
    given = _url_flag(url, PREPARED_STATEMENTS)
    if url.get_backend_name() != "postgresql":
        if given is None and prepared_statements in (None, True):
            return True
        raise StoreError(
            f"{PREPARED_STATEMENTS}= applies to Postgres only (it is for transaction-mode "
            "poolers such as PgBouncer)"
        )
    if prepared_statements is not None:
        return bool(prepared_statements)
    return given


def route_to_workers_option(url: URL, route_to_workers: bool | None) -> bool:
    """Whether the store sends its delegated calls straight to the session's worker:
    ``route_to_workers`` if given, else the URL's ``?route_to_workers=`` (true or false),
    else no. Only Postgres has the choice (it takes effect where Citus distributes the
    tables)."""
    chosen = route_to_workers if route_to_workers is not None else _url_flag(url, ROUTE_TO_WORKERS)
    if chosen and url.get_backend_name() != "postgresql":
        raise StoreError(
            f"{ROUTE_TO_WORKERS}= applies to Postgres only (it is for a Citus coordinator's URL)"
        )
    return bool(chosen)


def create_store_engine(
    url: URL,
    *,
    durability: Durability = "full",
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    read_only: bool = False,
    schema: str | None = None,
    pool_size: int = 5,
    pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    prepared_statements: bool | None = None,
) -> Engine:
    """An engine configured for zerda_store's transactions on SQLite or Postgres; no
    statement waits more than ``lock_timeout`` seconds for a lock, nor more than
    ``pool_timeout`` for a connection of the pool (``pool_size`` kept, 10 more in
    overflow). ``read_only`` opens connections that cannot write; ``schema`` (Postgres) is
    put first on the search_path. ``prepared_statements=False`` (Postgres) is for a
    transaction-mode pooler: see the module."""
    driver_url, options = engine_options(url, lock_timeout, schema)
    if prepared_statements is False:
        options["connect_args"]["prepare_threshold"] = None
    options.update(pool_size=pool_size, max_overflow=POOL_OVERFLOW, pool_timeout=pool_timeout)
    engine = sa.create_engine(driver_url, **options)
    configure(engine, url, durability, lock_timeout, read_only, schema, prepared_statements)
    return engine


def engine_options(url: URL, lock_timeout: float, schema: str | None) -> tuple[URL, dict[str, Any]]:
    """The URL to give the driver and the engine's options."""
    _check_supported(url)
    url = url.difference_update_query([PREPARED_STATEMENTS, ROUTE_TO_WORKERS])  # the store's
    if url.get_backend_name() == "sqlite":
        if schema is not None:
            raise StoreError("schema= applies to Postgres only: a SQLite file has no schemas")
        return url, {"connect_args": {"timeout": lock_timeout}}
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
    return url.difference_update_query(secrets), {
        "pool_recycle": 1800,
        "connect_args": connect_args,
    }


def configure(
    engine: Engine,
    url: URL,
    durability: Durability,
    lock_timeout: float,
    read_only: bool,
    schema: str | None,
    prepared_statements: bool | None = None,
) -> None:
    """The settings of every connection the engine opens (or, without
    ``prepared_statements``, of every transaction), and its liveness ping."""
    if url.get_backend_name() == "sqlite":
        _configure_sqlite(engine, url, durability, lock_timeout, read_only)
        return
    _ping_on_checkout(engine)
    if prepared_statements is False:
        scoped = transaction_settings(lock_timeout, read_only, schema)

        @event.listens_for(engine, "begin")
        def _apply_to_transaction(connection: Connection) -> None:
            if not connection.connection.dbapi_connection.autocommit:  # type: ignore[union-attr]
                connection.exec_driver_sql(scoped)

        return
    # Session settings rather than startup options: the URL's options, PGOPTIONS and
    # poolers that refuse startup options (PgBouncer) are left alone.
    settings = [
        f"SET {name} = {value}" for name, value in _settings(lock_timeout, read_only, schema)
    ]
    warned: list[bool] = []

    @event.listens_for(engine, "connect")
    def _apply_settings(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            for setting in settings:
                cursor.execute(setting)
            pooled, citus = _server_of(cursor, dbapi_connection)
            if pooled and prepared_statements is None:
                dbapi_connection.prepare_threshold = None
                if not warned:
                    warned.append(True)
                    logger.warning(
                        "%s is reached through a connection pooler: no statement is prepared "
                        "on its connections; if it pools by transaction (PgBouncer's "
                        "pool_mode = transaction), open the store with prepared_statements="
                        "False (?prepared_statements=false) so that its settings hold",
                        safe_url(url),
                    )
            elif not (pooled or citus):
                cursor.execute(_GENERIC_PLANS)
        finally:
            cursor.close()
        dbapi_connection.commit()


# The statements psycopg prepares (those run five times on a connection: the hot ones) keep
# one generic plan. Every one of them names its session and reads by indexes that match its
# conditions exactly, so the generic plan is the custom one without planning it again at
# each call: Postgres would otherwise re-plan the recall at every call once a session is
# large (0.3-0.5 ms, several times what it takes to run), because its estimate of the
# generic plan, made without the parameters, looks dearer. Not behind a pooler (the setting
# would reach other clients' server connections) nor on Citus, whose planner routes a
# statement by its parameters' values and so plans each execution.
_GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"


def _server_of(cursor: Any, dbapi_connection: Any) -> tuple[bool, bool]:
    """Whether a pooler stands between the connection and the server (the server process
    answering is not the one the connection was given at start-up: a pooler gives its
    clients process ids of its own), and whether the database has the citus extension."""
    cursor.execute(
        "SELECT pg_backend_pid(), EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"
    )
    pid, citus = cursor.fetchone()
    return pid != dbapi_connection.info.backend_pid, bool(citus)


def _settings(lock_timeout: float, read_only: bool, schema: str | None) -> list[tuple[str, str]]:
    """The Postgres settings of the store's connections, as (name, value)."""
    settings = [("lock_timeout", str(milliseconds(lock_timeout)))]
    if read_only:
        settings.append(("default_transaction_read_only", "on"))
    if schema is not None:
        settings.append(("search_path", checked_schema(schema)))
    return settings


def transaction_settings(lock_timeout: float, read_only: bool, schema: str | None) -> str:
    """One statement that gives the transaction it runs in the store's settings (its
    first statement, for a store without prepared statements: see the module)."""
    settings = [
        (name, value)
        if name != "default_transaction_read_only"
        else ("transaction_read_only", value)
        for name, value in _settings(lock_timeout, read_only, schema)
    ]
    return "SELECT " + ", ".join(
        f"set_config('{name}', '{value}', true)" for name, value in settings
    )


def milliseconds(seconds: float) -> int:
    """Whole milliseconds, at least 1 (0 would mean "wait forever" to Postgres)."""
    return max(1, math.ceil(seconds * 1000))


def checked_schema(schema: str) -> str:
    """``schema`` if it is a plain lower-case Postgres identifier, else a ValueError."""
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise RefusedValueError(
            f"schema must be a lower-case Postgres identifier (letters, digits, _), got {schema!r}"
        )
    return schema


def _ping_on_checkout(engine: Engine) -> None:
    """``pool_pre_ping``, skipped for :meth:`Store.run_write` and the driver-level units of work:
    they meet a dead connection at their first statement and run again whole."""

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if NO_PING.get():
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise sa.exc.DisconnectionError() from exc  # the pool takes another connection


def _configure_sqlite(
    engine: Engine, url: URL, durability: Durability, lock_timeout: float, read_only: bool
) -> None:
    synchronous = {"full": "FULL", "normal": "NORMAL"}[durability]
    busy_timeout_ms = milliseconds(lock_timeout)

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
        cursor = connection.cursor()
        cursor.execute("PRAGMA schema_version")  # reads the file: WAL needs the -shm here
        cursor.close()
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
