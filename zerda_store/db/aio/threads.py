"""The threads that run the units of work of async calls, and the hand-off to them.

A unit of work goes from the event loop straight to an idle thread, the one that went idle
last (each waits on a lock of its own, so only the thread that takes it wakes); with none
idle it waits in arrival order for the next thread to come free. Its outcome comes back
to its event loop by ``call_soon_threadsafe``, the last thing the thread does before it
takes the next one or goes idle. Nothing else is made per call: no executor future,
no chained asyncio future, no timer while a thread is free. Threads belong to no event
loop: any number of loops may hand work to them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ...errors import StoreError


class Job:
    """One unit of work handed to the threads, and its outcome for its event loop.

    ``claim`` holds one token, taken (:meth:`take`) by the thread that starts the job or
    by a caller that gives up on it before it started: exactly one of them has it. ``cancelled`` and ``committing`` are what a cancelled caller and the
    running unit of work agree on (:mod:`aio.unit_of_work`)."""

    __slots__ = (
        "cancelled",
        "claim",
        "committing",
        "delivered",
        "error",
        "future",
        "loop",
        "result",
        "run",
        "waiter",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, run: Callable[[], Any] | None = None
    ) -> None:
        self.run = run or _ran
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.waiter: asyncio.Future[None] | None = None
        self.claim = [True]
        self.cancelled = self.committing = self.delivered = False
        self.result: Any = None
        self.error: BaseException | None = None

    def take(self) -> bool:
        """Take the job's one token: True for the first to ask (a thread starting it, or
        its caller withdrawing it), False for everyone after."""
        try:
            self.claim.pop()
        except IndexError:
            return False
        return True

    def execute(self) -> None:
        """On a thread: run the job, unless its caller withdrew it, and hand its outcome
        to its event loop."""
        if not self.take():
            return
        try:
            self.result = self.run()
        except BaseException as exc:  # delivered to the caller, whatever it is
            self.error = exc
        self.run = _ran
        self._hand_back()

    def fail(self, error: BaseException) -> None:
        """On a thread: end a job that will never run with ``error``."""
        if self.take():
            self.error = error
            self._hand_back()

    def _hand_back(self) -> None:
        # A closed loop raises RuntimeError: nobody waits for the outcome there.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        """On the event loop: settle the caller's future (and the waiter of a caller that
        was cancelled meanwhile)."""
        self.delivered = True
        for future in (self.future, self.waiter):
            if future is not None and not future.done():
                if self.error is None:
                    future.set_result(self.result)
                else:
                    future.set_exception(self.error)

    async def outcome(self) -> Any:
        """The job's result (or its error raised), once it has ended; for a caller whose
        own wait was cancelled."""
        if not self.delivered:
            self.waiter = self.loop.create_future()
            await self.waiter
        if self.error is not None:
            raise self.error
        return self.result


def _ran() -> None:
    """What a job holds instead of its work once the work ran (nothing keeps it alive)."""


class _Worker:
    __slots__ = ("job", "wake")

    def __init__(self, job: Job | None) -> None:
        self.job = job
        self.wake = threading.Lock()
        self.wake.acquire()


class ThreadGroup:
    """``size`` threads, made as needed, taking jobs as described in the module."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._queued: deque[Job] = deque()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, job: Job) -> bool:
        """Hand ``job`` to a thread; False when every thread is busy and it waits."""
        with self._lock:
            if self._closed:
                raise StoreError("this store is closed")
            if self._idle:
                worker = self._idle.pop()
            elif len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._serve,
                    args=(_Worker(job),),
                    name=f"{self._name}_{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
                return True
            else:
                self._queued.append(job)
                return False
        worker.job = job
        worker.wake.release()
        return True

    def _serve(self, worker: _Worker) -> None:
        job = worker.job
        while job is not None:
            worker.job = None
            job.execute()
            with self._lock:
                if self._queued:
                    job = self._queued.popleft()
                    continue
                if self._closed:
                    return
                self._idle.append(worker)
            worker.wake.acquire()
            job = worker.job

    @property
    def waiting(self) -> int:
        """How many jobs wait for a thread right now (a racy read, for metrics)."""
        return len(self._queued)

    def shutdown(self) -> None:
        """Let the running jobs end and wait for them; the waiting ones fail, the store
        being closed."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            queued, self._queued = list(self._queued), deque()
            threads = list(self._threads)
        for job in queued:
            job.fail(StoreError("this store is closed"))
        for worker in idle:
            worker.wake.release()  # no job: the thread ends
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join()


class DatabaseThreads:
    """A store's threads for the units of work of async calls: ``size`` for every unit
    of work, and on SQLite one writer of its own for the writes (SQLite has one writer
    anyway; writers on several threads would wait in its busy handler, which polls)."""

    def __init__(self, size: int, dialect: str) -> None:
        self.size = size
        self._pool = ThreadGroup(size, "zerda-store-db")
        self._writer = ThreadGroup(1, "zerda-store-sqlite-writer") if dialect == "sqlite" else None

    @property
    def waiting(self) -> int:
        """How many units of work wait for a thread right now (for metrics)."""
        return self._pool.waiting + (0 if self._writer is None else self._writer.waiting)

    def submit(self, job: Job, *, write: bool) -> bool:
        """Hand ``job`` to a thread; False when it waits for one to come free."""
        group = self._writer if write and self._writer is not None else self._pool
        return group.submit(job)

    def shutdown(self) -> None:
        """Wait for the running units of work (those still waiting fail: the store is
        closed)."""
        for group in (self._pool, self._writer):
            if group is not None:
                group.shutdown()
