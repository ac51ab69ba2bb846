"""The async unit of work: :mod:`execution.unit_of_work`'s transactions, each run whole on one of the
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
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ...errors import CancelledAfterCommitError, CommitOutcomeUnknownError
from ...telemetry import units
from ..execution import unit_of_work
from ..execution.unit_of_work import Database, SessionLock, Transaction
from .threads import DatabaseThreads, Job

T = TypeVar("T")


class AsyncDatabase(Database, Protocol):
    """What the reads and writes sent from the event loop need of the store
    (:class:`~zerda_store.db.store.Store` is one): a kept connection taken on the loop, and
    the thread-run read to fall back on."""

    async def borrow_on_loop(self) -> Any | None: ...

    async def aread(self, work: Callable[[Transaction], T], *, snapshot: bool = False) -> T: ...


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


class _GuardedTransaction(Transaction):
    """The transaction a unit of work of an async call sees: before every statement it
    checks whether the caller was cancelled."""

    __slots__ = ("_job", "_transaction")

    def __init__(self, transaction: Transaction, job: Job) -> None:
        self._transaction = transaction
        self._job = job

    def run(self, statement: Any, values: Any = None) -> list[Any]:
        if self._job.cancelled:
            raise _Stopped
        return self._transaction.run(statement, values)

    def count(self, statement: Any, values: Any = None) -> int:
        if self._job.cancelled:
            raise _Stopped
        return self._transaction.count(statement, values)

    def run_many(self, statement: Any, values: Any) -> int:
        if self._job.cancelled:
            raise _Stopped
        return self._transaction.run_many(statement, values)


def _before_commit(job: Job) -> Callable[[], None]:
    """What runs right before COMMIT is sent: a cancelled caller stops it; otherwise the
    job is marked committing (a cancellation from then on cannot stop it). The caller
    reads the mark only once the job has ended, so no lock is needed."""

    def check() -> None:
        if job.cancelled:
            raise _Stopped
        job.committing = True

    return check


async def write(
    store: Database,
    threads: AsyncThreads,
    work: Callable[[Transaction], T],
    lock: SessionLock | None = None,
) -> T:
    """:func:`unit_of_work.write`, awaited: one write transaction on a database thread."""
    job = Job(asyncio.get_running_loop())

    def guarded(transaction: Transaction) -> T:
        return work(_GuardedTransaction(transaction, job))

    job.run = lambda: unit_of_work.write(store, guarded, lock, before_commit=_before_commit(job))
    return await _awaited(threads, job, write=True)  # type: ignore[no-any-return]


async def write_in_one_trip(
    store: Database,
    threads: AsyncThreads,
    first: Callable[[Callable[[], None]], tuple[bool, T]],
    then: Callable[[], tuple[Callable[[Transaction], T], SessionLock]],
) -> T:
    """A write sent whole by ``first`` (a Postgres pipeline whose answer is its commit:
    once sent, a cancellation cannot stop it), and only when that wrote nothing (it
    returns ``(False, _)``), the unit of work ``then`` builds, as :func:`write` runs it;
    both on one database thread, one hop. ``first`` gets the check to run right before it
    sends (what it does before, such as reading whether one trip fits, a cancellation
    still stops)."""
    job = Job(asyncio.get_running_loop())
    before_commit = _before_commit(job)

    def guarded(work: Callable[[Transaction], T]) -> Callable[[Transaction], T]:
        return lambda transaction: work(_GuardedTransaction(transaction, job))

    def run() -> T:
        done, value = first(before_commit)
        if done:
            return value
        job.committing = False  # nothing was written
        work, lock = then()
        return unit_of_work.write(store, guarded(work), lock, before_commit=before_commit)

    job.run = run
    return await _awaited(threads, job, write=True)  # type: ignore[no-any-return]


async def run(threads: AsyncThreads, call: Callable[[], T]) -> T:
    """``call``, which runs units of work of its own (a batched prune), on a database thread
    (the writer's on SQLite), awaited. A cancelled caller waits for it to end."""
    job = Job(asyncio.get_running_loop(), call)
    return await _awaited(threads, job, write=True)  # type: ignore[no-any-return]


async def read(
    store: Database,
    threads: AsyncThreads,
    work: Callable[[Transaction], T],
    *,
    snapshot: bool = False,
) -> T:
    """:func:`unit_of_work.read`, awaited: on a database thread."""
    job = Job(asyncio.get_running_loop())

    def guarded(transaction: Transaction) -> T:
        return work(_GuardedTransaction(transaction, job))

    job.run = lambda: unit_of_work.read(store, guarded, snapshot=snapshot)
    return await _awaited(threads, job, write=False)  # type: ignore[no-any-return]


async def _awaited(where: AsyncThreads, job: Job, *, write: bool) -> Any:
    threads = where.database_threads()
    job.run = units.carry(job.run)  # the caller's span and operation, on the thread
    timer = None
    if not threads.submit(job, write=write):  # every thread busy: it waits for one
        timer = job.loop.call_later(where.pool_timeout, _give_up, where, threads, job)
    try:
        return await job.future
    except asyncio.CancelledError:
        if job.take():  # never started
            raise
        job.cancelled = True
        if await _outcome_despite_cancellations(job):
            raise cancelled_after_commit() from None
        raise
    finally:
        if timer is not None:
            timer.cancel()


def _give_up(where: AsyncThreads, threads: DatabaseThreads, job: Job) -> None:
    """A job that found no thread free for ``pool_timeout`` fails without running."""
    if job.take() and not job.future.done():
        job.future.set_exception(where.threads_exhausted(threads.size))


def cancelled_after_commit() -> CancelledAfterCommitError:
    """What a write cancelled once its COMMIT was on its way raises, when it is stored."""
    return CancelledAfterCommitError(
        "the call was cancelled after its COMMIT had been sent: the write is stored "
        "(a retry with the same idempotency_key is a no-op)"
    )


async def _outcome_despite_cancellations(job: Job) -> bool:
    """:func:`_stored_anyway`, waited for to its end however often the caller is cancelled
    meanwhile (the wait is a statement or a COMMIT at most): a second cancellation must not
    turn a stored write into a plain cancellation, after which a retry without an
    idempotency key would store it twice."""
    while True:
        try:
            return await _stored_anyway(job)
        except asyncio.CancelledError:
            continue


async def _stored_anyway(job: Job) -> bool:
    """Wait for a cancelled unit of work to stop (rolled back, its connection back) or to
    finish the COMMIT it had sent; whether it committed. A connection lost during that
    COMMIT raises :class:`CommitOutcomeUnknownError`."""
    try:
        await job.outcome()
    except CommitOutcomeUnknownError:
        raise
    except Exception:  # stopped, or failed: rolled back
        return False
    return job.committing
