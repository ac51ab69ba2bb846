"""The async part of :class:`store.Store`: awaited units of work on the store's database
threads (:mod:`aio.unit_of_work`), and the threads that run synchronous extraction for
async callers.

The store makes one :class:`AsyncPart` in its constructor and holds it; its async methods
delegate to it, and :meth:`Store.close` closes it. The part knows its store only as a
:class:`unit_of_work.Database`, so async calls use the store's one pool and its connection
settings: the same lock timeout, read-only and schema settings, pragmas and read-only
opening as the sync calls, because they are the same connections.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ...errors import PoolExhaustedError, StoreError
from ..execution.unit_of_work import Database, SessionLock, Transaction
from . import unit_of_work as async_unit_of_work
from .threads import DatabaseThreads

# Threads for synchronous extraction (an LLM without agenerate, stanza) called from async
# code: each waits on one model call, so they are many more than the cores.
DEFAULT_LLM_WORKERS = 32
# Threads (each with a connection of the pool when busy) for the async calls' units of work.
DEFAULT_ASYNC_POOL_SIZE = 10
T = TypeVar("T")


class AsyncPart:
    """The threads of a store's async calls, and its units of work awaited on them.

    The units of work run on ``async_pool_size`` database threads, made on first use and
    shared by every event loop (on SQLite, writes on one writer thread of their own);
    synchronous extraction (an LLM without ``agenerate``, stanza) runs on ``llm_workers``
    threads of its own, never on an event loop's default executor. A call that finds no
    database thread free for ``pool_timeout`` seconds fails without running.
    """

    def __init__(
        self, database: Database, *, llm_workers: int, async_pool_size: int, pool_timeout: float
    ) -> None:
        if llm_workers < 1 or async_pool_size < 1:
            raise ValueError("llm_workers and async_pool_size must be at least 1")
        self._database = database
        self.llm_workers = llm_workers
        self.async_pool_size = async_pool_size
        self.pool_timeout = pool_timeout
        self._threads: DatabaseThreads | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Stop the LLM threads, and wait for the database threads' running units of work
        (from :meth:`Store.close`, before the pool's connections are closed); threads are
        never made again afterwards."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
            threads, self._threads = self._threads, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if threads is not None:
            threads.shutdown()

    def database_threads(self) -> DatabaseThreads:
        """The threads that run the async calls' units of work, made on first use."""
        threads = self._threads
        if threads is None:
            with self._lock:
                if self._closed:
                    raise StoreError("this store is closed")
                if self._threads is None:
                    self._threads = DatabaseThreads(self.async_pool_size, self._database.dialect)
                threads = self._threads
        return threads

    def units_waiting(self) -> int:
        """How many units of work wait for a database thread (0 before any was made)."""
        threads = self._threads
        return 0 if threads is None else threads.waiting

    def threads_exhausted(self, size: int) -> PoolExhaustedError:
        """The error of an async call that found no database thread free in time."""
        return PoolExhaustedError(
            f"all {size} database threads of the store for async calls "
            f"(async_pool_size={size}) stayed busy for {self.pool_timeout:g} s "
            "(pool_timeout): open the store with a larger Store(async_pool_size=...) or send "
            "fewer calls at once; nothing was run"
        )

    async def write(self, work: Callable[[Transaction], T], lock: SessionLock | None = None) -> T:
        """One write transaction on a database thread (:func:`aio.unit_of_work.write`)."""
        return await async_unit_of_work.write(self._database, self, work, lock)

    async def write_in_one_trip(
        self,
        first: Callable[[Callable[[], None]], tuple[bool, T]],
        then: Callable[[], tuple[Callable[[Transaction], T], SessionLock]],
    ) -> T:
        """A write tried whole first, on a database thread
        (:func:`aio.unit_of_work.write_in_one_trip`)."""
        return await async_unit_of_work.write_in_one_trip(self._database, self, first, then)

    async def run(self, call: Callable[[], T]) -> T:
        """``call`` (units of work of its own) on a database thread (:func:`aio.unit_of_work.run`)."""
        return await async_unit_of_work.run(self, call)

    async def read(self, work: Callable[[Transaction], T], *, snapshot: bool = False) -> T:
        """Reads only, on a database thread (:func:`aio.unit_of_work.read`)."""
        return await async_unit_of_work.read(self._database, self, work, snapshot=snapshot)

    @property
    def llm_executor(self) -> ThreadPoolExecutor:
        """The threads for synchronous extraction called from async code, made on first use."""
        executor = self._executor
        if executor is None:
            with self._lock:
                if self._closed:
                    raise StoreError("this store is closed")
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        self.llm_workers, thread_name_prefix="zerda-store-llm"
                    )
                executor = self._executor
        return executor
