"""The async half of :class:`engine.Store`: awaited units of work on the store's database
threads (:mod:`unit_of_work_aio`), and the threads that run synchronous extraction for
async callers.

Async calls use the store's one pool and its connection settings: the same lock
timeout, read-only and schema settings, pragmas and read-only opening as the sync calls,
because they are the same connections.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar, cast

from ..errors import PoolExhaustedError, StoreError
from . import unit_of_work_aio as async_unit_of_work
from .unit_of_work import SessionLock, Transaction
from .unit_of_work_aio import DatabaseThreads

if TYPE_CHECKING:
    from .engine import Store

# Threads for synchronous extraction (an LLM without agenerate, stanza) called from async
# code: each waits on one model call, so they are many more than the cores.
DEFAULT_LLM_WORKERS = 32
# Threads (each with a connection of the pool when busy) for the async calls' units of work.
DEFAULT_ASYNC_POOL_SIZE = 10
T = TypeVar("T")


class AsyncStore:
    """The async methods of :class:`engine.Store`.

    Their units of work run on ``async_pool_size`` database threads of the store, made on
    first use and shared by every event loop (on SQLite, writes on one writer thread of
    their own); synchronous extraction (an LLM without ``agenerate``, stanza) runs on the
    store's own ``llm_workers`` threads, never on an event loop's default executor.
    """

    closed: bool
    dialect: str
    pool_timeout: float

    def init_async(self, llm_workers: int, async_pool_size: int) -> None:
        if llm_workers < 1 or async_pool_size < 1:
            raise ValueError("llm_workers and async_pool_size must be at least 1")
        self.llm_workers = llm_workers
        self.async_pool_size = async_pool_size
        self._threads: DatabaseThreads | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._threads_lock = threading.Lock()

    async def __aenter__(self) -> Store:
        return cast("Store", self)

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def close_async(self) -> None:
        """Stop the LLM threads, and wait for the database threads' running units of work
        (from :meth:`Store.close`, before the pool's connections are closed)."""
        with self._threads_lock:
            executor, self._executor = self._executor, None
            threads, self._threads = self._threads, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if threads is not None:
            threads.shutdown()

    async def aclose(self) -> None:
        """:meth:`Store.close` from async code: it waits for running units of work on a
        thread, not on the event loop. The store cannot be used afterwards."""
        await asyncio.to_thread(cast("Store", self).close)

    def database_threads(self) -> DatabaseThreads:
        """The threads that run the async calls' units of work, made on first use."""
        threads = self._threads
        if threads is None:
            with self._threads_lock:
                if self.closed:
                    raise StoreError("this store is closed")
                if self._threads is None:
                    self._threads = DatabaseThreads(self.async_pool_size, self.dialect)
                threads = self._threads
        return threads

    def threads_exhausted(self, size: int) -> PoolExhaustedError:
        """The error of an async call that found no database thread free in time."""
        return PoolExhaustedError(
            f"all {size} database threads of the store for async calls "
            f"(async_pool_size={size}) stayed busy for {self.pool_timeout:g} s "
            "(pool_timeout): open the store with a larger Store(async_pool_size=...) or send "
            "fewer calls at once; nothing was run"
        )

    async def awrite(self, work: Callable[[Transaction], T], lock: SessionLock | None = None) -> T:
        """:meth:`Store.write`, awaited (:func:`unit_of_work_aio.write`)."""
        store = cast("Store", self)
        store.check_writable()
        return await async_unit_of_work.write(store, work, lock)

    async def aread(self, work: Callable[[Transaction], T], *, snapshot: bool = False) -> T:
        """:meth:`Store.read`, awaited (:func:`unit_of_work_aio.read`)."""
        return await async_unit_of_work.read(cast("Store", self), work, snapshot=snapshot)

    @property
    def llm_executor(self) -> ThreadPoolExecutor:
        """The store's threads for synchronous extraction called from async code."""
        executor = self._executor
        if executor is None:
            with self._threads_lock:
                if self.closed:
                    raise StoreError("this store is closed")
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        self.llm_workers, thread_name_prefix="zerda-store-llm"
                    )
                executor = self._executor
        return executor
