"""Driver connections kept between units of work, outside the pool: a unit of work that
left no transaction open gives its connection back here, and the next one takes it without
the pool's checkin, reset and checkout (a fifth of a recall's time on SQLite). Kept ones
count as checked out of the pool: a SQLite store keeps 4, so the pool's others stay free
for SQLAlchemy's own connections; a Postgres store keeps up to the pool's size, and
SQLAlchemy's own connections (rare: migrations, the Citus check) then come from its
overflow. A forked child never uses, closes or returns its parent's.

An event loop's unit of work (:mod:`aio.loop_reads`, :mod:`aio.loop_writes`) takes only a kept
connection: the pool's checkout may connect, which a loop must not wait for. When none is
kept while others of the loop's kind are out (a wave of requests), it waits on the loop
for the next one given back instead of going to a database thread: such units are one
round trip each, and a hand-off to a thread and back costs more CPU than the wait. A
connection given back on the waiter's own loop is handed over directly; one given back
elsewhere is kept, and the waiter told to take again (nothing is in transit to a loop
that may never run again). It waits at most ``LOOP_WAIT_SECONDS``, then goes to a thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

# How many connections a SQLite store keeps (each holds its own page cache). A Postgres
# store keeps up to its pool's size: its async path sends a turn's reads and its save from
# the event loop only on a kept connection (:mod:`aio.loop_reads`, :mod:`aio.loop_writes`), and a
# service's requests come in waves (at C = 200 with 4 kept, half of them found none and
# went to a thread).
KEPT_CONNECTIONS = 4
# A connection idle longer than this goes back to the pool (its recycling and a liveness
# check apply there) instead of being used again directly.
KEPT_SECONDS = 30.0
# How long an event loop's unit of work waits for a kept connection given back before it
# goes to a database thread (many round trips; a loop busy elsewhere is slow to resume).
LOOP_WAIT_SECONDS = 0.1

# Connections a forked child inherited from its parent's stores: referenced for the life
# of the child so that garbage collection never closes the parent's sockets.
_INHERITED: list[Any] = []


class KeptConnections:
    """The connections one store keeps; dropped (invalidated) whenever its engine is
    disposed. ``give_back`` is the store's: a connection a waiting loop's unit no longer
    wants goes back through it (kept, or to the pool; closed once the store is closed);
    ``to_pool`` returns one kept too long to the pool the same way, never kept again."""

    def __init__(
        self,
        engine: Engine,
        give_back: Callable[[Any], None],
        to_pool: Callable[[Any], None],
    ) -> None:
        self._engine = engine
        self._give_back = give_back
        self._to_pool = to_pool
        postgres = engine.dialect.name == "postgresql"
        self._limit = engine.pool.size() if postgres else KEPT_CONNECTIONS  # type: ignore[attr-defined]
        self._idle: list[tuple[Any, float]] = []
        # Connections out with an event loop's unit of work (by id), and the loops' units
        # waiting for one to be given back (futures, first come first served).
        self._lent: set[int] = set()
        self._waiters: deque[asyncio.Future[Any]] = deque()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        event.listen(engine, "engine_disposed", self._drop)

    def take(self) -> tuple[Any | None, bool]:
        """A kept connection to use again, or None; and whether the one found had been
        idle too long (it went back to the pool: take the next with a liveness ping)."""
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            if not self._idle:
                return None, False
            connection, kept_at = self._idle.pop()
        if time.monotonic() - kept_at < KEPT_SECONDS:
            return connection, False
        self._to_pool(connection)
        return None, True

    async def take_on_loop(self) -> Any | None:
        """For an event loop's unit of work: a kept connection, waited for while others
        are out with the loops' units (see the module); None when there is none to wait
        for, or it did not come within ``LOOP_WAIT_SECONDS``."""
        if self._pid != os.getpid():
            self._after_fork()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOOP_WAIT_SECONDS
        while True:
            connection, waiter = self._take_or_wait(loop)
            if waiter is None:
                return connection
            timer = loop.call_at(deadline, _expire, waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                handed = waiter.result() if waiter.done() and not waiter.cancelled() else None
                if handed is not None and handed is not _TAKE_AGAIN:
                    self._give_back(handed)  # handed over as the caller was cancelled
                raise
            finally:
                timer.cancel()
            if handed is not _TAKE_AGAIN:
                return handed

    def _take_or_wait(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[Any | None, asyncio.Future[Any] | None]:
        """A kept connection (lent to the loop), or a future to wait on while others are
        lent, or neither."""
        stale, connection, waiter = [], None, None
        with self._lock:
            while self._idle:
                found, kept_at = self._idle.pop()
                if time.monotonic() - kept_at < KEPT_SECONDS:
                    self._lent.add(id(found))
                    connection = found
                    break
                stale.append(found)
            else:
                if self._lent:
                    waiter = loop.create_future()
                    self._waiters.append(waiter)
        for old in stale:
            self._to_pool(old)  # back to the pool, for its recycling and liveness ping
        return connection, waiter

    def keep(self, connection: Any) -> bool:
        """Keep ``connection`` for the next unit of work (an event loop's unit waiting for
        one gets it at once); False when enough are kept. A unit waiting on another loop
        is only told to take again, the connection kept meanwhile: nothing is ever in
        transit to a loop that may not run again."""
        with self._lock:
            self._lent.discard(id(connection))
            waiter = None
            while self._waiters and waiter is None:
                waiter = self._waiters.popleft()
                if waiter.done():  # expired or cancelled
                    waiter = None
            if waiter is not None and waiter.get_loop() is _running_loop():
                self._lent.add(id(connection))
                waiter.set_result(connection)  # this thread runs its loop: resumed soon
                return True
            if waiter is None and len(self._idle) >= self._limit:
                return False
            self._idle.append((connection, time.monotonic()))
        if waiter is not None:
            _wake(waiter, _TAKE_AGAIN)
        return True

    def forget(self, connection: Any) -> None:
        """``connection`` goes back to the pool, not kept: when it was the last out with
        the loops' units, those waiting have nothing to wait for and go to threads."""
        with self._lock:
            self._lent.discard(id(connection))
            if self._lent:
                return
            waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            _wake(waiter, None)

    def __len__(self) -> int:
        return len(self._idle)

    def _after_fork(self) -> None:
        """In a forked child: never use, close or return the parent's connections (their
        sockets and files are the parent's); keep them referenced so that nothing closes
        them, and start a pool of the child's own."""
        _INHERITED.append(self._idle)
        self._idle, self._pid = [], os.getpid()
        self._lent, self._waiters = set(), deque()  # the parent's loops are not here
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        self._engine.dispose(close=False)

    def _drop(self, *_: object) -> None:
        if self._pid != os.getpid():
            self._after_fork()
            return
        while self._idle:
            try:
                connection, _kept_at = self._idle.pop()
            except IndexError:
                break
            connection.invalidate()


# What a unit waiting on another loop is told when a connection is kept for it.
_TAKE_AGAIN = object()


def _expire(waiter: asyncio.Future[Any]) -> None:
    """A loop's unit that waited long enough for a connection: it goes to a thread."""
    if not waiter.done():
        waiter.set_result(None)


def _wake(waiter: asyncio.Future[Any], value: Any) -> None:
    """Tell a waiting loop's unit to take again (``_TAKE_AGAIN``) or to go to a thread
    (None), on its own loop."""
    loop = waiter.get_loop()
    if _running_loop() is loop:
        _answer(waiter, value)
        return
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there
        loop.call_soon_threadsafe(_answer, waiter, value)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _answer(waiter: asyncio.Future[Any], value: Any) -> None:
    if not waiter.done():
        waiter.set_result(value)
