"""Room for waiting writers between the short transactions of a long job on SQLite.

SQLite does not queue writers: one that finds the write lock taken sleeps and polls again
(its busy handler's sleeps grow to 0.1 s). A job that commits one short transaction and
begins the next at once can hold the lock nearly all the time, and a waiting save may miss
every gap until its busy timeout runs out. So once such a job has held the lock for
``HOLD`` seconds since its last pause, it pauses for ``PAUSE``, longer than the longest
poll: every waiting writer gets its turn, and none waits much longer than ``HOLD``. Postgres
queues the waiters on the locks themselves: no pause there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Write-lock time (seconds) a long job takes between two pauses, and the pause.
HOLD = 0.1
PAUSE = 0.15


class WriterPacing:
    """Call :meth:`after` with each transaction's duration; it pauses when due."""

    def __init__(self, dialect: str, sleep: Callable[[float], None] | None = None) -> None:
        self.active = dialect == "sqlite"
        self.sleep = sleep or time.sleep
        self.held = 0.0

    def after(self, took: float) -> None:
        if not self.active:
            return
        self.held += took
        if self.held >= HOLD:
            self.sleep(PAUSE)
            self.held = 0.0
