"""The async unit of work: :mod:`unit_of_work`'s transactions, awaited on the event loop.

The same attempt (:func:`unit_of_work.attempt`), the same work functions, the same
compiled statements and row readers, the same retry rules and error mapping: only the
connection differs. It comes from the store's async pool (psycopg's ``AsyncConnection`` on
Postgres, aiosqlite on SQLite, through SQLAlchemy's asyncio extension), and the attempt
runs in a greenlet (:func:`sqlalchemy.util.greenlet_spawn`) in which every driver call
awaits on the event loop: no thread per call, and no second copy of any work function.

A cancelled call (``asyncio.wait_for``, a client that went away) is thrown into the
attempt at the driver call it was awaiting: the attempt gives its connection back to
the pool, which rolls back whatever was left open, before the cancellation goes on.

On SQLite, writes go to a dedicated writer: one thread per store that runs each write
transaction whole on the sync path's connection, one hop from the event loop per
transaction. SQLite has one writer anyway; through aiosqlite each statement would be a
hop of its own, and on a busy event loop every hop waits its turn in the loop's queue
while holding SQLite's write lock (measured, 200 concurrent load-and-save turns on a
2-core machine: 630-770 turns/s through the writer, 290-460 through aiosqlite, with
30-50% more CPU). Writers in other processes still meet the busy timeout. A cancelled
write is stopped at its next statement and rolled back; the cancellation waits for that,
so the connection is back when it returns (a write cancelled during its COMMIT is kept,
whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.util import greenlet_spawn

from . import unit_of_work
from .unit_of_work import SessionLock, Transaction

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .engine import Store

T = TypeVar("T")


class AsyncConnections:
    """A store's async pool, bound to the event loop that made it. It stands where the
    :class:`Store` stands for :func:`unit_of_work.attempt` (``engine``, ``dialect``,
    ``borrow``, ``give_back``, ``drop_connections``); its methods run in the attempt's
    greenlet."""

    def __init__(
        self, async_engine: AsyncEngine, unavailable: Callable[[BaseException], Exception]
    ) -> None:
        self.async_engine = async_engine
        self._unavailable = unavailable
        self.engine: Engine = async_engine.sync_engine
        self.dialect = self.engine.dialect.name
        self.loop = asyncio.get_running_loop()
        self.writer = (
            ThreadPoolExecutor(1, thread_name_prefix="zerda-store-sqlite-writer")
            if self.dialect == "sqlite"
            else None
        )

    def borrow(self) -> Any:
        """A connection of the pool (no liveness ping); a failure to connect is the
        store's :class:`DatabaseUnavailableError`, its secrets masked, as on the sync path."""
        try:
            return self.engine.raw_connection()
        # A pool's raw connection reports the driver's own error, not SQLAlchemy's.
        except (DBAPIError, self.engine.dialect.loaded_dbapi.Error) as exc:
            raise self._unavailable(exc) from None

    def give_back(self, connection: Any, *, reusable: bool) -> None:
        connection.close()  # back to the pool, which rolls back anything left open

    def drop_connections(self) -> None:
        self.engine.dispose()

    def in_use(self) -> int:
        """How many of the pool's connections are checked out right now."""
        return int(self.engine.pool.checkedout())  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        if self.writer is not None:
            self.writer.shutdown(wait=False)
        await self.async_engine.dispose()

    def drop(self) -> None:
        """Forget the pool's connections without closing them (from sync code while an
        event loop runs: closing them would need to await)."""
        if self.writer is not None:
            self.writer.shutdown(wait=False)
        self.engine.dispose(close=False)


class _Cancelled(Exception):
    """Raised in the SQLite writer at the next statement of a write whose caller was
    cancelled: the attempt rolls back and gives its connection back."""


class _CancellableTransaction(Transaction):
    __slots__ = ("_cancelled", "_transaction")

    def __init__(self, transaction: Transaction, cancelled: threading.Event) -> None:
        self._transaction = transaction
        self._cancelled = cancelled

    def run(self, statement: Any, values: Any = None) -> list[Any]:
        self._check()
        return self._transaction.run(statement, values)

    def count(self, statement: Any, values: Any = None) -> int:
        self._check()
        return self._transaction.count(statement, values)

    def run_many(self, statement: Any, values: Any) -> int:
        self._check()
        return self._transaction.run_many(statement, values)

    def _check(self) -> None:
        if self._cancelled.is_set():
            raise _Cancelled


async def _on_writer(
    store: Store, writer: ThreadPoolExecutor, work: Callable[[Transaction], T]
) -> T:
    """One SQLite write transaction, whole, on the store's writer thread."""
    cancelled = threading.Event()

    def cancellable(transaction: Transaction) -> T:
        return work(_CancellableTransaction(transaction, cancelled))

    def run() -> T:
        return unit_of_work.attempt(store, cancellable, write=True, snapshot=False)

    future = asyncio.get_running_loop().run_in_executor(writer, run)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancelled.set()
        with contextlib.suppress(BaseException):
            await future  # rolled back (or committed whole) and given back
        raise


async def write(
    store: Store, work: Callable[[Transaction], T], lock: SessionLock | None = None
) -> T:
    """:func:`unit_of_work.write`, awaited: one write transaction, run again from scratch
    after a deadlock, a serialization failure or a connection lost before the commit."""
    connections = await store.async_connections()
    locked_work = unit_of_work.locked(store, work, lock)

    async def attempt() -> T:
        if connections.writer is None:
            return await _spawn(connections, locked_work, write=True, snapshot=False)
        return await _on_writer(store, connections.writer, locked_work)

    return await _with_retries(store, attempt, unit_of_work.retryable_write)


async def read(store: Store, work: Callable[[Transaction], T], *, snapshot: bool = False) -> T:
    """:func:`unit_of_work.read`, awaited."""
    connections = await store.async_connections()
    return await _with_retries(
        store,
        lambda: _spawn(connections, work, write=False, snapshot=snapshot),
        unit_of_work.retryable_read,
    )


def _spawn(
    connections: AsyncConnections,
    work: Callable[[Transaction], T],
    *,
    write: bool,
    snapshot: bool,
) -> Awaitable[T]:
    return greenlet_spawn(unit_of_work.attempt, connections, work, write=write, snapshot=snapshot)


async def _with_retries(
    store: Store,
    attempt: Callable[[], Awaitable[T]],
    retryable: Callable[[DBAPIError], bool],
) -> T:
    for number in range(1, unit_of_work.WRITE_ATTEMPTS + 1):
        try:
            return await attempt()
        except (unit_of_work.LostCommit, DBAPIError) as exc:
            raised = unit_of_work.failure(store, exc, number, retryable)
            if raised is not None:
                raise raised from raised.__cause__
        await asyncio.sleep(unit_of_work.backoff(number))
    raise AssertionError("unreachable")
