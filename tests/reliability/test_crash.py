"""kill -9 of a writer in the middle of its stream of turns, round after round: every
acknowledged turn is kept with all its snippets, no turn is partial, and the SQLite file
passes its integrity and foreign-key checks."""

from __future__ import annotations

import multiprocessing
import random
import sqlite3

import pytest
import sqlalchemy as sa

from tests.reliability.crash_writer import READY, crash_turn, write_until_killed
from tests.reliability.helpers import (
    duplicated_tags,
    inspect_database,
    keys_of,
    snippet_keys_by_turn,
    table_counts,
)
from zerda_store import ConversationEntityMemory

ROUNDS = {"sqlite": 20, "postgres": 10}
SESSION_ID = "crm-crash"
MAX_KILL_DELAY_SECONDS = 0.2
HANG_GUARD_SECONDS = 60


@pytest.fixture(scope="module")
def forkserver() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.reliability.crash_writer"])
    return context


def _run_and_kill(
    context: multiprocessing.context.BaseContext, url: str, round_number: int, delay: float
) -> list[int]:
    """Start a writer, let it acknowledge at least one turn, kill it with SIGKILL
    ``delay`` seconds later; the indexes of the turns it acknowledged."""
    acks, child_end = context.Pipe(duplex=False)
    writer = context.Process(  # type: ignore[attr-defined]
        target=write_until_killed, args=(url, SESSION_ID, round_number, child_end)
    )
    writer.start()
    child_end.close()
    try:
        assert acks.poll(HANG_GUARD_SECONDS), "the writer never started"
        assert acks.recv() == READY
        assert acks.poll(HANG_GUARD_SECONDS), "the writer never acknowledged a turn"
        writer.join(delay)
    finally:
        writer.kill()
        writer.join()
    assert writer.exitcode == -9
    acknowledged = []
    while True:
        try:
            acknowledged.append(acks.recv())
        except EOFError:
            break
    acks.close()
    assert acknowledged == list(range(len(acknowledged)))
    assert acknowledged
    return acknowledged


def _check_sqlite_file(url: str) -> None:
    path = sa.make_url(url).database
    assert path is not None
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        connection.close()


@pytest.mark.slow
def test_killed_writers_keep_every_acknowledged_turn(
    database_url: str,
    forkserver: multiprocessing.context.BaseContext,
    capsys: pytest.CaptureFixture[str],
) -> None:
    backend = sa.make_url(database_url).get_backend_name()
    rounds = ROUNDS["sqlite" if backend == "sqlite" else "postgres"]
    rng = random.Random(7)
    acknowledged: set[str] = set()
    in_flight: set[str] = set()  # the turn each writer was saving when it was killed

    for round_number in range(rounds):
        delay = rng.uniform(0, MAX_KILL_DELAY_SECONDS)
        indexes = _run_and_kill(forkserver, database_url, round_number, delay)
        acknowledged |= {crash_turn(round_number, i)[0] for i in indexes}
        in_flight.add(crash_turn(round_number, len(indexes))[0])

        with inspect_database(database_url) as connection:
            stored = snippet_keys_by_turn(connection, SESSION_ID)
            assert duplicated_tags(connection, SESSION_ID) == []
            counts = table_counts(connection, SESSION_ID)
        missing = sorted(acknowledged - stored.keys())
        assert missing == [], f"round {round_number}: acknowledged turns lost"
        assert stored.keys() <= acknowledged | in_flight
        for tag, keys in stored.items():
            round_of_tag, index = (int(part) for part in tag[1:].split("-"))
            expected = keys_of(crash_turn(round_of_tag, index)[1])
            assert sorted(keys) == expected, f"turn {tag} is partial"
        assert counts.turns == len(stored)
        assert counts.contexts == sum(len(keys) for keys in stored.values())
        assert counts.entities == len({key for keys in stored.values() for key in keys})
        if backend == "sqlite":
            _check_sqlite_file(database_url)

    with ConversationEntityMemory(database_url=database_url, session_id=SESSION_ID) as memory:
        stats = memory.get_memory_stats()
        assert (stats["message_count"], stats["total_contexts"]) == (
            counts.turns,
            counts.contexts,
        )
    kept = len(acknowledged & stored.keys())
    unacknowledged_kept = len(stored.keys() - acknowledged)
    assert kept == len(acknowledged)
    with capsys.disabled():
        print(
            f"\n[crash {backend}] rounds={rounds} acknowledged={len(acknowledged)} "
            f"kept={kept} in-flight turns that committed before the kill={unacknowledged_kept}"
        )
