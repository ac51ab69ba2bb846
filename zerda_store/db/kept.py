"""Driver connections kept between units of work, outside the pool: a unit of work that
left no transaction open gives its connection back here, and the next one takes it without
the pool's checkin, reset and checkout (a fifth of a recall's time on SQLite). Kept ones
count as checked out of the pool: a SQLite store keeps 4, so the pool's others stay free
for SQLAlchemy's own connections; a Postgres store keeps up to the pool's size, and
SQLAlchemy's own connections (rare: migrations, the Citus check) then come from its
overflow. A forked child never uses, closes or returns its parent's."""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

# How many connections a SQLite store keeps (each holds its own page cache). A Postgres
# store keeps up to its pool's size: its async path sends a turn's reads and its save from
# the event loop only on a kept connection (:mod:`loop_reads`, :mod:`loop_writes`), and a
# service's requests come in waves (at C = 200 with 4 kept, half of them found none and
# went to a thread).
KEPT_CONNECTIONS = 4
# A connection idle longer than this goes back to the pool (its recycling and a liveness
# check apply there) instead of being used again directly.
KEPT_SECONDS = 30.0

# Connections a forked child inherited from its parent's stores: referenced for the life
# of the child so that garbage collection never closes the parent's sockets.
_INHERITED: list[Any] = []


class KeptConnections:
    """The connections one store keeps; dropped (invalidated) whenever its engine is
    disposed."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        postgres = engine.dialect.name == "postgresql"
        self._limit = engine.pool.size() if postgres else KEPT_CONNECTIONS  # type: ignore[attr-defined]
        self._idle: list[tuple[Any, float]] = []
        self._pid = os.getpid()
        event.listen(engine, "engine_disposed", self._drop)

    def take(self) -> tuple[Any | None, bool]:
        """A kept connection to use again, or None; and whether the one found had been
        idle too long (it went back to the pool: take the next with a liveness ping)."""
        if self._pid != os.getpid():
            self._after_fork()
        try:
            connection, kept_at = self._idle.pop()
        except IndexError:
            return None, False
        if time.monotonic() - kept_at < KEPT_SECONDS:
            return connection, False
        connection.close()
        return None, True

    def keep(self, connection: Any) -> bool:
        """Keep ``connection`` for the next unit of work; False when enough are kept."""
        if len(self._idle) >= self._limit:
            return False
        self._idle.append((connection, time.monotonic()))
        return True

    def __len__(self) -> int:
        return len(self._idle)

    def _after_fork(self) -> None:
        """In a forked child: never use, close or return the parent's connections (their
        sockets and files are the parent's); keep them referenced so that nothing closes
        them, and start a pool of the child's own."""
        _INHERITED.append(self._idle)
        self._idle, self._pid = [], os.getpid()
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
