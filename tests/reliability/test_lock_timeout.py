"""A save (or a recall) behind a lock that another connection holds gives up after the
store's ``lock_timeout`` with :class:`zerda_store.LockTimeoutError`, and writes nothing;
it never waits forever (SQLite and Postgres).

On Postgres another connection holds ``LOCK TABLE entities IN ACCESS EXCLUSIVE MODE``
(nothing can read or write the table); on SQLite another connection holds the write lock
(``BEGIN IMMEDIATE``), and reads go on (WAL).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

import zerda_store
from tests.doubles import KeywordLLM
from tests.reliability.helpers import inspect_database, table_counts
from zerda_store import ConversationEntityMemory, Store

LOCK_TIMEOUT = 0.5
# Giving up takes the lock timeout plus a little; SQLite's busy timeout is 5 s.
GIVES_UP_WITHIN = 4.0
# Only a guard, so that a call that waits forever fails the test instead of hanging it.
HANG_GUARD_SECONDS = 20
SESSION = "crm-locked"
ADA = "Ada North"


class Call:
    """A call run in a thread: its result or error, and how long it took."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def _run(self, target: Callable[[], Any]) -> None:
        started = time.monotonic()
        try:
            self.result = target()
        except BaseException as exc:
            self.error = exc
        finally:
            self.seconds = time.monotonic() - started

    def finished_within(self, seconds: float) -> bool:
        self._thread.join(seconds)
        return not self._thread.is_alive()


@contextmanager
def lock_held_elsewhere(url: str) -> Iterator[None]:
    """Another connection holds a lock that a save needs, until the block ends: on
    Postgres an exclusive lock on the entities table, on SQLite the write lock."""
    if sa.make_url(url).get_backend_name() == "sqlite":
        holder = sqlite3.connect(sa.make_url(url).database, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            yield
        finally:
            holder.rollback()
            holder.close()
        return
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("LOCK TABLE entities IN ACCESS EXCLUSIVE MODE")
            try:
                yield
            finally:
                connection.rollback()
    finally:
        engine.dispose()


def _memory(store: Store) -> ConversationEntityMemory:
    """A memory of a session where Ada North has one snippet."""
    memory = ConversationEntityMemory(llm=KeywordLLM([ADA]), store=store, session_id=SESSION)
    memory.save_context({"input": f"{ADA} signed the renewal."}, {"output": "Great."})
    return memory


def _save(memory: ConversationEntityMemory) -> Callable[[], None]:
    return lambda: memory.save_context({"input": f"{ADA} called again."}, {"output": "Noted."})


def _run_behind_lock(url: str, target: Callable[[], Any]) -> tuple[Call, bool]:
    """Run ``target`` while the lock is held elsewhere; whether it finished before the
    guard ran out. The call is over when this returns (the lock is released either way)."""
    with lock_held_elsewhere(url):
        call = Call(target)
        finished = call.finished_within(HANG_GUARD_SECONDS)
    assert call.finished_within(HANG_GUARD_SECONDS), "the call still ran after the lock was gone"
    return call, finished


def _assert_gave_up_on_the_lock(call: Call, finished: bool, within: float) -> None:
    assert finished, f"the call still waited for the lock after {HANG_GUARD_SECONDS} s"
    error = call.error
    assert type(error).__name__ == "LockTimeoutError", f"{type(error).__name__}: {error}"
    assert isinstance(error, zerda_store.LockTimeoutError)  # the class the package exports
    assert isinstance(error, zerda_store.StoreError)
    assert "lock" in str(error)
    assert call.seconds is not None and call.seconds < within, call.seconds


def _session_counts(url: str) -> tuple[int, ...]:
    """Turns, entities and snippets of the session (one of each after ``_memory``)."""
    with inspect_database(url) as connection:
        return tuple(table_counts(connection, SESSION))


@pytest.mark.parametrize(
    ("options", "within"),
    [
        ({"lock_timeout": LOCK_TIMEOUT}, GIVES_UP_WITHIN),
        pytest.param({}, HANG_GUARD_SECONDS, marks=pytest.mark.slow, id="default"),
    ],
)
def test_a_save_behind_a_held_lock_raises_lock_timeout_error_and_writes_nothing(
    database_url: str, options: dict[str, float], within: float
) -> None:
    with Store(database_url, **options) as store:
        memory = _memory(store)

        call, finished = _run_behind_lock(database_url, _save(memory))

    _assert_gave_up_on_the_lock(call, finished, within=within)
    assert _session_counts(database_url) == (1, 1, 1)


@pytest.mark.postgres
def test_a_recall_behind_a_locked_table_raises_lock_timeout_error(postgres_url: str) -> None:
    with Store(postgres_url, lock_timeout=LOCK_TIMEOUT) as store:
        memory = _memory(store)

        call, finished = _run_behind_lock(
            postgres_url, lambda: memory.load_memory_variables({"input": f"How is {ADA}?"})
        )

    _assert_gave_up_on_the_lock(call, finished, within=GIVES_UP_WITHIN)


def test_sqlite_recalls_go_on_while_a_save_waits_for_the_write_lock(sqlite_url: str) -> None:
    """On a new file, which the memory migrates first: the store's lock timeout holds on
    every connection afterwards, the one the migration used included."""
    with Store(sqlite_url, lock_timeout=LOCK_TIMEOUT) as store:
        memory = _memory(store)

        with lock_held_elsewhere(sqlite_url):
            save = Call(_save(memory))
            recalled = memory.load_memory_variables({"input": f"How is {ADA}?"})
            finished = save.finished_within(HANG_GUARD_SECONDS)

    assert ADA in recalled["entity_info"]
    assert f"{ADA} signed the renewal." in recalled["entity_info"]
    _assert_gave_up_on_the_lock(save, finished, within=GIVES_UP_WITHIN)
    assert _session_counts(sqlite_url) == (1, 1, 1)
