"""The async half of :class:`engine.Store`: its async pool, awaited units of work, and the
threads that run synchronous extraction for async callers.

The async engine gets the sync engine's options and connection settings
(:func:`connection_settings.engine_options`, :func:`connection_settings.configure`): the same lock timeout, the same
read-only and schema settings on Postgres, the same pragmas and read-only opening on
SQLite.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar, cast

from sqlalchemy.engine import URL

from ..errors import StoreError
from . import unit_of_work_aio as async_unit_of_work
from .settings import DEFAULT_LOCK_TIMEOUT, configure, engine_options
from .unit_of_work import SessionLock, Transaction
from .unit_of_work_aio import AsyncConnections

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .engine import Store
    from .settings import Durability

logger = logging.getLogger("zerda_store.engine")

# Threads for synchronous extraction (an LLM without agenerate, stanza) called from async
# code: each waits on one model call, so they are many more than the cores.
DEFAULT_LLM_WORKERS = 32
# Connections of the async pool (Postgres: as many again in overflow).
DEFAULT_ASYNC_POOL_SIZE = 10

_ASYNC_DRIVERS = {"postgresql": "postgresql+psycopg_async", "sqlite": "sqlite+aiosqlite"}
T = TypeVar("T")


def create_async_store_engine(
    url: URL,
    *,
    durability: Durability = "full",
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    read_only: bool = False,
    schema: str | None = None,
    pool_size: int = DEFAULT_ASYNC_POOL_SIZE,
) -> AsyncEngine:
    """The async twin of :func:`engine.create_store_engine`: the same settings on the
    async drivers (psycopg's ``AsyncConnection``, aiosqlite), through SQLAlchemy's asyncio
    extension and its async-adapted pool."""
    driver_url, options = engine_options(url, lock_timeout, schema)
    backend = url.get_backend_name()
    driver_url = driver_url.set(drivername=_ASYNC_DRIVERS[backend])
    if backend == "postgresql":
        options.update(pool_size=pool_size, max_overflow=pool_size)
    else:
        # aiosqlite gives each connection a thread of its own: a few are enough for reads
        # (WAL lets them run beside the one writer).
        options.update(pool_size=min(pool_size, 4), max_overflow=min(pool_size, 4))
    # SQLAlchemy's asyncio extension (and its ORM) load with the first async call.
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(driver_url, **options)
    # No liveness ping on checkout: the async path checks out only for units of work,
    # which meet a dead connection at their first statement and run again whole.
    configure(engine.sync_engine, url, durability, lock_timeout, read_only, schema, ping=False)
    return engine


class AsyncStore:
    """The async methods of :class:`engine.Store`.

    They use a second pool on the async drivers, made on first use inside the running
    event loop (``async_pool_size`` connections, as many again in overflow on Postgres),
    and run synchronous extraction (an LLM without ``agenerate``, stanza) on the store's
    own ``llm_workers`` threads, never on the event loop's shared default executor.
    """

    url: URL
    durability: Durability
    lock_timeout: float
    read_only: bool
    schema: str | None
    closed: bool

    def init_async(self, llm_workers: int, async_pool_size: int) -> None:
        if llm_workers < 1 or async_pool_size < 1:
            raise ValueError("llm_workers and async_pool_size must be at least 1")
        self.llm_workers = llm_workers
        self.async_pool_size = async_pool_size
        self._async: AsyncConnections | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()

    async def __aenter__(self) -> Store:
        return cast("Store", self)

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def close_async(self) -> None:
        """Stop the LLM threads and drop the async pool (from :meth:`Store.close`)."""
        self._stop_executor()
        connections, self._async = self._async, None
        if connections is not None:
            _drop_async(connections)

    async def aclose(self) -> None:
        """Close both pools' connections from async code; the store cannot be used
        afterwards."""
        connections, self._async = self._async, None
        cast("Store", self).close()
        if connections is not None:
            await connections.aclose()

    async def async_connections(self) -> AsyncConnections:
        """The async pool of the running event loop, made on first use. A store used
        from a new event loop (``asyncio.run`` again) closes the old loop's pool and makes
        another: async connections belong to one loop."""
        if self.closed:
            raise StoreError("this store is closed")
        connections = self._async
        if connections is not None and connections.loop is asyncio.get_running_loop():
            return connections
        self._async = AsyncConnections(
            create_async_store_engine(
                self.url,
                durability=self.durability,
                lock_timeout=self.lock_timeout,
                read_only=self.read_only,
                schema=self.schema,
                pool_size=self.async_pool_size,
            ),
            cast("Store", self).unavailable,
        )
        if connections is not None:
            try:
                await connections.aclose()
            except Exception:  # the old loop's connections may not close from this one
                logger.debug("dropped the async pool of a former event loop", exc_info=True)
        return self._async

    async def awrite(self, work: Callable[[Transaction], T], lock: SessionLock | None = None) -> T:
        """:meth:`Store.write`, awaited on the async pool (:func:`async_unit_of_work.write`)."""
        store = cast("Store", self)
        store.check_writable()
        return await async_unit_of_work.write(store, work, lock)

    async def aread(self, work: Callable[[Transaction], T], *, snapshot: bool = False) -> T:
        """:meth:`Store.read`, awaited on the async pool (:func:`async_unit_of_work.read`)."""
        return await async_unit_of_work.read(cast("Store", self), work, snapshot=snapshot)

    @property
    def llm_executor(self) -> ThreadPoolExecutor:
        """The store's threads for synchronous extraction called from async code."""
        executor = self._executor
        if executor is None:
            with self._executor_lock:
                if self.closed:
                    raise StoreError("this store is closed")
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        self.llm_workers, thread_name_prefix="zerda-store-llm"
                    )
                executor = self._executor
        return executor

    def _stop_executor(self) -> None:
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def _drop_async(connections: AsyncConnections) -> None:
    """Close an async pool from sync code: properly when no event loop runs in this thread,
    else by dropping its connections (the server or SQLite closes them with the socket)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            asyncio.run(connections.aclose())
            return
        except Exception:
            logger.debug("could not close the async pool's connections", exc_info=True)
    connections.drop()
