"""A long job of short write transactions pauses on SQLite once it has held the write lock
for a while (its waiting writers poll; they are not queued), and never on Postgres."""

from __future__ import annotations

from zerda_store.db.execution import pacing
from zerda_store.db.execution.pacing import WriterPacing


def test_a_job_on_sqlite_pauses_longer_than_a_poll_once_it_held_the_lock_long_enough() -> None:
    pauses: list[float] = []
    paced = WriterPacing("sqlite", sleep=pauses.append)

    for _ in range(10):
        paced.after(0.03)  # ten transactions of 30 ms: 0.3 s of the write lock

    assert pauses == [pacing.PAUSE] * 2
    assert pacing.PAUSE > 0.1  # SQLite's busy handler polls at most every 0.1 s


def test_a_job_on_postgres_never_pauses() -> None:
    pauses: list[float] = []
    paced = WriterPacing("postgresql", sleep=pauses.append)

    for _ in range(10):
        paced.after(1.0)

    assert pauses == []
