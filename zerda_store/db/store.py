"""The shared :class:`Store` (its engines' connection settings are in :mod:`connections.settings`, the
async part it holds in :mod:`aio.store`, the URLs it accepts in :mod:`connections.urls`).

SQLite gets durable commits, a busy timeout, foreign keys, and write transactions that
begin IMMEDIATE (a deferred read-then-write transaction cannot wait for a concurrent writer
and fails with "database is locked"); WAL is switched on where the schema is created
(:mod:`migration.migrate`), never on a file merely opened. Postgres goes through psycopg 3 with pre-ping
and a connect timeout, so a dead server fails in seconds instead of hanging.

A store opened with ``read_only=True`` never writes: SQLite opens the file with ``mode=ro``
(and, in a folder where SQLite cannot create the ``-shm`` file a WAL database needs, with
``immutable=1`` when no ``-wal`` file holds changes); Postgres sessions run with
``default_transaction_read_only``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Self, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Dialect
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ..errors import (
    DatabaseUnavailableError,
    DatabaseUrlError,
    LockTimeoutError,
    PoolExhaustedError,
    ReadOnlyStoreError,
    RefusedValueError,
    StoreError,
    first_line,
)
from ..telemetry import Telemetry, default_telemetry
from .aio.store import DEFAULT_ASYNC_POOL_SIZE, DEFAULT_LLM_WORKERS, AsyncPart
from .connections.idle import KeptConnections
from .connections.settings import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_POOL_TIMEOUT,
    IMMUTABLE,
    NO_PING,
    POOL_OVERFLOW,
    POSTGRES_EXTRA,
    Durability,
    checked_schema,
    create_store_engine,
    prepared_statements_option,
    route_to_workers_option,
    transaction_settings,
)
from .connections.urls import resolve_url, safe_url, scrub
from .execution import unit_of_work
from .execution.driver import CompiledStatement, compile_statement
from .execution.unit_of_work import SessionLock, Transaction
from .placements import Placements

logger = logging.getLogger("zerda_store.engine")

T = TypeVar("T")
C = TypeVar("C")
S = TypeVar("S")
R = TypeVar("R")
P = ParamSpec("P")


class StoreCore:
    """What a :class:`Store` runs on: one engine (one connection pool), the units of work
    run on it, and one set of compiled statements that many memories share. The package's
    parts hold the core (:func:`core_of`); users hold the :class:`Store`, which shows only
    what they call."""

    def __init__(
        self,
        database_url: str | URL | None = None,
        *,
        durability: Durability = "full",
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        read_only: bool = False,
        schema: str | None = None,
        llm_workers: int = DEFAULT_LLM_WORKERS,
        async_pool_size: int = DEFAULT_ASYNC_POOL_SIZE,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
        prepared_statements: bool | None = None,
        telemetry: Telemetry | None = None,
        route_to_workers: bool | None = None,
    ):
        for name, seconds in (("lock_timeout", lock_timeout), ("pool_timeout", pool_timeout)):
            if not seconds > 0:
                raise RefusedValueError(
                    f"{name} must be a positive number of seconds, got {seconds}"
                )
        self.pool_timeout = float(pool_timeout)
        self.telemetry = telemetry or default_telemetry()  # docs/observability.md
        self.url = resolve_url(database_url)
        self.lock_timeout = float(lock_timeout)
        self.durability: Durability = durability
        self.read_only = read_only
        self.schema = checked_schema(schema) if schema is not None else None
        # True, False, or None: not said (none prepared where a pooler is found, :mod:`connections.settings`).
        self.prepared_statements = prepared_statements_option(self.url, prepared_statements)
        # Citus: where each session's delegated calls go straight to (:mod:`placements`).
        self.placements: Placements[StoreCore] | None = None
        if route_to_workers_option(self.url, route_to_workers):
            self.placements = Placements(self, self._open_worker)
        self._aio = AsyncPart(
            self,
            llm_workers=llm_workers,
            async_pool_size=async_pool_size,
            pool_timeout=self.pool_timeout,
        )
        self._statements: dict[Callable[[Dialect], Any], Any] = {}
        self._statements_lock = threading.Lock()
        try:
            self.engine = create_store_engine(
                self.url,
                durability=durability,
                lock_timeout=self.lock_timeout,
                read_only=read_only,
                schema=self.schema,
                pool_size=async_pool_size + 1,
                pool_timeout=self.pool_timeout,
                prepared_statements=self.prepared_statements,
            )
        except ImportError as exc:
            raise StoreError(
                f"cannot use the database URL {safe_url(self.url)}: "
                f"{scrub(str(exc), self.url)}; {POSTGRES_EXTRA}"
            ) from None
        except DatabaseUrlError:
            raise
        except (ArgumentError, ValueError) as exc:
            raise DatabaseUrlError(
                f"cannot use the database URL {safe_url(self.url)}: "
                f"{scrub(str(exc), self.url)}; zerda_store runs on sqlite:/// and postgresql:// URLs"
            ) from None
        self.dialect = self.engine.dialect.name
        # The statement that opens each transaction of a store without prepared statements;
        # with a schema, its reads need it too (the search_path), so they run in one.
        self.transaction_settings: CompiledStatement | None = None
        if self.prepared_statements is False:
            self.transaction_settings = compile_statement(
                sa.text(transaction_settings(self.lock_timeout, read_only, self.schema)),
                self.engine.dialect,
            )
        self.reads_need_settings = self.transaction_settings is not None and bool(self.schema)
        if read_only:
            self.require_file()
        self._kept = KeptConnections(
            self.engine,
            lambda c: self.give_back(c, reusable=True),
            lambda c: self.give_back(c, reusable=False),
        )
        self.schema_checked = False
        self.schema_lock = threading.Lock()
        self.closed = False
        # Connections on their way back into the pool while the store is open: close()
        # waits for them before it disposes of the pool (H11), and any given back once it
        # began is closed instead.
        self._returning = 0
        self._returned = threading.Condition(threading.Lock())
        self._on_close: list[Callable[[], object]] = []

    def __repr__(self) -> str:
        return f"StoreCore({safe_url(self.url)!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

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

    def close(self) -> None:
        """Close every connection of the store (first running what :meth:`on_close`
        registered, such as stopping a sweeper, and waiting for the async calls' running
        units of work); the store cannot be used afterwards. From async code prefer
        :meth:`aclose`, which waits on a thread."""
        callbacks, self._on_close = self._on_close, []
        for callback in reversed(callbacks):
            callback()
        with self._returned:
            self.closed = True
            self._returned.wait_for(lambda: not self._returning)
        self._aio.close()
        self.drop_connections()
        for worker in self.placements.close() if self.placements is not None else ():
            worker.close()

    def _open_worker(self, url: URL) -> StoreCore:
        """A store on a Citus worker at ``url`` with this store's settings, for the calls
        sent straight to it (:mod:`placements`)."""
        return StoreCore(
            url,
            durability=self.durability,
            lock_timeout=self.lock_timeout,
            read_only=self.read_only,
            schema=self.schema,
            llm_workers=1,
            async_pool_size=self.async_pool_size,
            pool_timeout=self.pool_timeout,
            prepared_statements=self.prepared_statements,
            telemetry=self.telemetry,
            route_to_workers=False,
        )

    async def aclose(self) -> None:
        """:meth:`close` from async code: it waits for running units of work on a thread,
        not on the event loop. The store cannot be used afterwards."""
        await asyncio.to_thread(self.close)

    def on_close(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` when the store closes (the last registered first): how a
        feature built on the store, such as the retention sweeper, is stopped with it."""
        self._on_close.append(callback)

    @contextmanager
    def connect(self, *, ping: bool = True) -> Iterator[Connection]:
        """A connection, with connection failures reported as :class:`DatabaseUnavailableError`.

        ``ping=False`` skips the Postgres liveness check, for callers that run again whole
        when the connection turns out dead."""
        connection = self._checked_out(self.engine.connect, ping=ping)
        try:
            yield connection
        finally:
            with self._giving_back() as closed:
                if closed:  # closed meanwhile: not back into a pool nobody uses
                    connection.invalidate()
                connection.close()

    @contextmanager
    def _giving_back(self) -> Iterator[bool]:
        """The return of a connection into the pool, and whether the store is closed. One
        that began while it was open ends before :meth:`close` disposes of the pool; once
        the close began, the connection is to be closed: none outlives the store (H11)."""
        with self._returned:
            closed = self.closed
            self._returning += not closed
        try:
            yield closed
        finally:
            if not closed:
                with self._returned:
                    self._returning -= 1
                    if self.closed and not self._returning:
                        self._returned.notify_all()

    def _checked_out(self, open_connection: Callable[[], C], *, ping: bool) -> C:
        if self.closed:
            raise StoreError("this store is closed")
        token = NO_PING.set(not ping)
        try:
            return open_connection()
        # A pool's raw connection reports the driver's own error, not SQLAlchemy's.
        except (DBAPIError, self.engine.dialect.loaded_dbapi.Error) as exc:
            raise self.unavailable(exc) from None
        except PoolTimeout:
            raise self.pool_exhausted() from None
        finally:
            NO_PING.reset(token)

    def pool_exhausted(self) -> PoolExhaustedError:
        """The error to raise when no connection of the pool came free in time."""
        pool: Any = self.engine.pool
        return PoolExhaustedError(
            f"all {pool.size() + POOL_OVERFLOW} connections of the store's pool to "
            f"{self.location} stayed in use for {self.pool_timeout:g} s (pool_timeout): "
            "fewer threads at once on one store, or a larger pool with "
            "Store(async_pool_size=...); nothing was run"
        )

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

    async def awrite(self, work: Callable[[Transaction], T], lock: SessionLock | None = None) -> T:
        """:meth:`write`, awaited: run on one of the async part's database threads."""
        self.check_writable()
        return await self._aio.write(work, lock)

    async def awrite_in_one_trip(
        self,
        first: Callable[[Callable[[], None]], tuple[bool, T]],
        then: Callable[[], tuple[Callable[[Transaction], T], SessionLock]],
    ) -> T:
        """:meth:`awrite`, tried whole first (:func:`aio.unit_of_work.write_in_one_trip`)."""
        self.check_writable()
        return await self._aio.write_in_one_trip(first, then)

    async def arun(self, call: Callable[[], T]) -> T:
        """Run ``call``, sync code that runs units of work of its own (a batched prune), on
        one of the store's database threads (the writer's on SQLite), awaited; never on the
        event loop's default executor."""
        return await self._aio.run(call)

    async def aread(self, work: Callable[[Transaction], T], *, snapshot: bool = False) -> T:
        """:meth:`read`, awaited: run on one of the async part's database threads."""
        return await self._aio.read(work, snapshot=snapshot)

    @property
    def llm_executor(self) -> ThreadPoolExecutor:
        """The store's threads for synchronous extraction called from async code."""
        return self._aio.llm_executor

    @property
    def llm_workers(self) -> int:
        """How many threads :attr:`llm_executor` has."""
        return self._aio.llm_workers

    def units_waiting(self) -> int:
        """How many async units of work wait for a database thread (for metrics)."""
        return self._aio.units_waiting()

    @property
    def async_pool_size(self) -> int:
        """How many database threads run the async calls' units of work."""
        return self._aio.async_pool_size

    def borrow(self) -> Any:
        """A driver connection for one attempt of a unit of work: one that an earlier unit
        gave back, else one from the pool. No liveness ping: a unit of work meets a dead
        connection at its first statement and runs again."""
        if not self.closed:
            connection, stale = self._kept.take()
            if connection is not None:
                return connection
            if stale:  # out of the pool again, with its recycling and liveness ping
                return self._checked_out(self.engine.raw_connection, ping=True)
        return self._checked_out(self.engine.raw_connection, ping=False)

    async def borrow_on_loop(self) -> Any | None:
        """A kept connection for a unit of work on an event loop, or None (:mod:`connections.idle`)."""
        return None if self.closed else await self._kept.take_on_loop()

    def give_back(self, connection: Any, *, reusable: bool) -> None:
        """Keep a connection a unit of work left with no transaction open for the next one
        (:mod:`connections.idle`); otherwise return it to the pool, which rolls back what is left open."""
        reusable = reusable and not connection.info.get(IMMUTABLE)
        if reusable and not self.closed and self._kept.keep(connection):
            if self.closed:  # closed meanwhile, maybe after it dropped the kept ones
                self.drop_connections()
            return
        self._kept.forget(connection)
        with self._giving_back() as closed:
            if closed:  # closed meanwhile: not back into a pool nobody uses (H11)
                with contextlib.suppress(Exception):
                    connection.invalidate()
            connection.close()

    def connections_in_use(self) -> int:
        """How many of the pool's connections are in use right now (kept idle ones are
        not: any unit of work may take them)."""
        return int(self.engine.pool.checkedout()) - len(self._kept)  # type: ignore[attr-defined]

    def drop_connections(self) -> None:
        """Close every connection, kept or pooled (after a lost one, the others are most
        likely gone with it, as SQLAlchemy assumes on its own path)."""
        self.engine.dispose()  # the engine_disposed listener drops the kept ones

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


class Store:
    """One database for many memories: its connection pool, its compiled statements and
    the threads its async calls run on, shared by every memory opened on it.

    ``lock_timeout`` (seconds) bounds how long a statement waits for a lock another
    connection holds; past it the call raises :class:`LockTimeoutError`. Use the store as
    a context manager (``with`` or ``async with``) or call :meth:`close` (from async code,
    ``await`` :meth:`aclose`); closing never deletes data. The async calls of the memories
    on it run each unit of work whole on one of ``async_pool_size`` database threads, on
    the same pool. The pool keeps a connection for
    each of those threads and one more, and opens up to 10 more for sync callers; a call
    that finds no connection (or, async, no thread) free for ``pool_timeout`` seconds
    raises :class:`PoolExhaustedError`.

    ``read_only=True`` opens the database for reading only: it is never created, migrated
    or written (a SQLite file that is not there is a :class:`DatabaseUnavailableError`, a
    write a :class:`ReadOnlyStoreError`). ``schema`` (Postgres) names the schema that holds
    zerda_store's tables (it goes first on the connections' search_path; ``db upgrade``
    creates it if needed).

    ``prepared_statements=False`` (Postgres; or ``?prepared_statements=false`` in the URL)
    is for a transaction-mode pooler such as PgBouncer: no statement is prepared on the
    server, and the store's settings are sent inside each transaction instead of once per
    connection (:mod:`connections.settings`). Schema changes (``db upgrade``) need a direct connection.

    ``route_to_workers=True`` (Citus; or ``?route_to_workers=true`` in the coordinator's
    URL) sends each save's and each recall's call straight to the worker that holds the
    session's shards, one hop instead of two, on a pool per worker with the store's
    settings; everything else goes to the coordinator (:mod:`placements`, docs/citus.md).

    ``telemetry`` (a :class:`zerda_store.telemetry.Telemetry`) says how the store reports
    itself to OpenTelemetry: by default through the global providers, once configured, and
    without turn texts, names or snippets (docs/observability.md).

    What a store shows is what its users call: where it is (:attr:`url`, :attr:`location`,
    :attr:`safe_url`, :attr:`dialect`, :attr:`schema`, :attr:`read_only`, :attr:`closed`),
    a connection for SQL of their own (:meth:`connect`, or :attr:`engine` for SQLAlchemy),
    the checks a tool makes before it writes, and closing it. The rest is on its
    :class:`StoreCore`.
    """

    def __init__(
        self,
        database_url: str | URL | None = None,
        *,
        durability: Durability = "full",
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        read_only: bool = False,
        schema: str | None = None,
        llm_workers: int = DEFAULT_LLM_WORKERS,
        async_pool_size: int = DEFAULT_ASYNC_POOL_SIZE,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
        prepared_statements: bool | None = None,
        telemetry: Telemetry | None = None,
        route_to_workers: bool | None = None,
    ):
        self._core = StoreCore(
            database_url,
            durability=durability,
            lock_timeout=lock_timeout,
            read_only=read_only,
            schema=schema,
            llm_workers=llm_workers,
            async_pool_size=async_pool_size,
            pool_timeout=pool_timeout,
            prepared_statements=prepared_statements,
            telemetry=telemetry,
            route_to_workers=route_to_workers,
        )

    def __repr__(self) -> str:
        return f"Store({self._core.safe_url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    @property
    def url(self) -> URL:
        """The database's URL (SQLAlchemy's; its string form hides the password)."""
        return self._core.url

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._core.dialect

    @property
    def schema(self) -> str | None:
        """The Postgres schema that holds zerda_store's tables, if one was named."""
        return self._core.schema

    @property
    def read_only(self) -> bool:
        """Whether the store was opened for reading only."""
        return self._core.read_only

    @property
    def location(self) -> str:
        """Where the database is, for messages: the SQLite file's path, else the URL
        without its password."""
        return self._core.location

    @property
    def safe_url(self) -> str:
        """This store's URL as messages show it, with every secret masked."""
        return self._core.safe_url

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (a closed store cannot be used)."""
        return self._core.closed

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine (the store's pool), for SQL of the user's own."""
        return self._core.engine

    def check_writable(self) -> None:
        """Raise :class:`ReadOnlyStoreError` if this store was opened read-only (before
        work that would write)."""
        self._core.check_writable()

    def require_file(self) -> None:
        """Raise :class:`DatabaseUnavailableError` if this is a SQLite file that is not
        there (opening it would create an empty database)."""
        self._core.require_file()

    def connect(self) -> contextlib.AbstractContextManager[Connection]:
        """A SQLAlchemy connection from the store's pool (``with store.connect() as
        connection:``), a failure to connect reported as :class:`DatabaseUnavailableError`."""
        return self._core.connect()

    def close(self) -> None:
        """Close every connection of the store (first stopping what runs on it, such as a
        retention sweeper, and waiting for the async calls' running units of work); the
        store cannot be used afterwards, and its data stays. From async code prefer
        :meth:`aclose`."""
        self._core.close()

    async def aclose(self) -> None:
        """:meth:`close` from async code: it waits on a thread, not on the event loop."""
        await self._core.aclose()

    @staticmethod
    def resolve_url(database_url: str | URL | None = None) -> URL:
        """The URL ``Store(database_url)`` opens: the argument, else
        ``ZERDA_STORE_DATABASE_URL``, else the SQLite file; ``postgresql://`` mapped to
        psycopg 3, and a password in ``?password=`` or with unencoded ``@`` signs taken."""
        return resolve_url(database_url)

    @staticmethod
    def mask_secrets(text: str, url: URL) -> str:
        """``text`` with every secret of ``url`` (password, secret query values) masked, raw
        or percent-encoded: for showing a driver's message or a URL to a person."""
        return scrub(text, url)


def core_of(store: Store | StoreCore) -> StoreCore:
    """The core a store runs on: what the package's parts (memories, repositories,
    migrations) hold and call; a core is its own."""
    return store._core if isinstance(store, Store) else store


def takes_store(
    operation: Callable[Concatenate[StoreCore, P], R],
) -> Callable[Concatenate[Store | StoreCore, P], R]:
    """``operation``, which works on a core, as the public faces hand it to users
    (:mod:`zerda_store.migrate`): given the user's :class:`Store` (or a core)."""

    @functools.wraps(operation)
    def on_store(store: Store | StoreCore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return operation(core_of(store), *args, **kwargs)

    return on_store
