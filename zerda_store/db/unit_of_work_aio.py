"""The async unit of work: :mod:`unit_of_work`'s transactions, each run whole on one of the
store's database threads and awaited from the event loop.

The same attempt, work functions, compiled statements, retry rules and error mapping as
the sync path, on the same pool: a unit of work is one hop to a thread and one back. Its
statements run back to back on the thread, so a transaction never waits for the event
loop: how busy the loop is cannot stretch a transaction (holding its session lock) or
leave a connection idle in transaction, and the CPU a call costs is the sync path's plus
the two hops. Threads and pool belong to no event loop, so one store serves any number of
loops at once (``asyncio.run`` in several threads), and closing it closes every
connection it opened.

``async_pool_size`` threads run the units of work; on SQLite, writes go to one writer
thread of their own (SQLite has one writer anyway; writers on several threads would wait
in its busy handler, which polls). A unit of work that finds no thread free for
``pool_timeout`` seconds fails with :class:`PoolExhaustedError` without running.

A cancelled caller (``asyncio.wait_for``, a client that went away) stops its unit of
work at the next statement, or right before COMMIT is sent: it rolls back, and the
cancellation goes on once the connection is back (a statement at most). A cancellation
that arrives after COMMIT was sent cannot stop it: the caller waits for the COMMIT and,
if it committed, raises :class:`CancelledAfterCommitError` (a
:class:`CommitOutcomeUnknownError`) instead of the cancellation, so that a cancelled call
is never stored without the caller being told.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from ..errors import CancelledAfterCommitError, CommitOutcomeUnknownError
from . import unit_of_work
from .unit_of_work import Database, SessionLock, Transaction

T = TypeVar("T")


class DatabaseThreads:
    """A store's threads for the units of work of async calls."""

    def __init__(self, size: int, dialect: str) -> None:
        self.size = size
        self._pool = ThreadPoolExecutor(size, thread_name_prefix="zerda-store-db")
        self._writer = (
            ThreadPoolExecutor(1, thread_name_prefix="zerda-store-sqlite-writer")
            if dialect == "sqlite"
            else None
        )

    def executor(self, *, write: bool) -> ThreadPoolExecutor:
        return self._writer if write and self._writer is not None else self._pool

    def shutdown(self) -> None:
        """Wait for the units of work that run (those still queued find the store closed)."""
        for executor in (self._pool, self._writer):
            if executor is not None:
                executor.shutdown(wait=True)


class AsyncThreads(Protocol):
    """Where an awaited unit of work runs (the store's async part is one): the database
    threads, how long a call may wait for one of them, and the error when none came free."""

    @property
    def pool_timeout(self) -> float: ...

    def database_threads(self) -> DatabaseThreads: ...

    def threads_exhausted(self, size: int) -> BaseException: ...


class _Stopped(Exception):
    """Raised in a unit of work whose caller was cancelled, at its next statement or
    right before its COMMIT: the attempt rolls back and gives its connection back."""


class _Gate:
    """What a cancelled caller and its unit of work's thread agree on: the thread checks
    it before every statement and before COMMIT; once COMMIT is sent, a cancellation can
    no longer stop the unit of work."""

    __slots__ = ("_lock", "cancelled", "committing")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled = False
        self.committing = False

    def check(self) -> None:
        if self.cancelled:
            raise _Stopped

    def before_commit(self) -> None:
        with self._lock:
            if self.cancelled:
                raise _Stopped
            self.committing = True

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True

    def guarded(self, work: Callable[[Transaction], T]) -> Callable[[Transaction], T]:
        def checked_work(transaction: Transaction) -> T:
            return work(_GuardedTransaction(transaction, self))

        return checked_work


class _GuardedTransaction(Transaction):
    __slots__ = ("_gate", "_transaction")

    def __init__(self, transaction: Transaction, gate: _Gate) -> None:
        self._transaction = transaction
        self._gate = gate

    def run(self, statement: Any, values: Any = None) -> list[Any]:
        self._gate.check()
        return self._transaction.run(statement, values)

    def count(self, statement: Any, values: Any = None) -> int:
        self._gate.check()
        return self._transaction.count(statement, values)

    def run_many(self, statement: Any, values: Any) -> int:
        self._gate.check()
        return self._transaction.run_many(statement, values)


async def write(
    store: Database,
    threads: AsyncThreads,
    work: Callable[[Transaction], T],
    lock: SessionLock | None = None,
) -> T:
    """:func:`unit_of_work.write`, awaited: one write transaction on a database thread."""
    gate = _Gate()
    guarded = gate.guarded(work)

    def run() -> T:
        return unit_of_work.write(store, guarded, lock, before_commit=gate.before_commit)

    return await _awaited(threads, run, gate, write=True)


async def read(
    store: Database,
    threads: AsyncThreads,
    work: Callable[[Transaction], T],
    *,
    snapshot: bool = False,
) -> T:
    """:func:`unit_of_work.read`, awaited: on a database thread."""
    gate = _Gate()
    guarded = gate.guarded(work)

    def run() -> T:
        return unit_of_work.read(store, guarded, snapshot=snapshot)

    return await _awaited(threads, run, gate, write=False)


async def _awaited(where: AsyncThreads, run: Callable[[], T], gate: _Gate, *, write: bool) -> T:
    threads = where.database_threads()
    future = threads.executor(write=write).submit(run)
    loop = asyncio.get_running_loop()
    exhausted = False

    def give_up() -> None:
        nonlocal exhausted
        exhausted = future.cancel()  # still queued: every thread stayed busy

    timer = loop.call_later(where.pool_timeout, give_up)
    try:
        return await asyncio.wrap_future(future, loop=loop)
    except asyncio.CancelledError:
        if exhausted:
            raise where.threads_exhausted(threads.size) from None
        if future.cancel():  # never started
            raise
        gate.cancel()
        if await _stored_anyway(future, gate):
            raise CancelledAfterCommitError(
                "the call was cancelled after its COMMIT had been sent: the write is stored "
                "(a retry with the same idempotency_key is a no-op)"
            ) from None
        raise
    finally:
        timer.cancel()


async def _stored_anyway(future: Future[Any], gate: _Gate) -> bool:
    """Wait for a cancelled unit of work to stop (rolled back, its connection back) or to
    finish the COMMIT it had sent; whether it committed. A connection lost during that
    COMMIT raises :class:`CommitOutcomeUnknownError`."""
    try:
        await asyncio.wrap_future(future)
    except CommitOutcomeUnknownError:
        raise
    except Exception:  # stopped, or failed: rolled back
        return False
    return gate.committing
