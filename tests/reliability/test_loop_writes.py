"""Postgres: an async save that fits one round trip is sent from the event loop as one
pipeline, with no database thread; until its sync is sent a cancellation stores nothing,
after it the caller learns the commit's outcome, and an error the server reports sends the
write to the thread path, as if the loop had not tried.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import AsyncKeywordLLM, CountedThreads
from zerda_store import (
    CancelledAfterCommitError,
    ConversationEntityMemory,
    LockTimeoutError,
    StoreError,
)
from zerda_store.db.aio import loop_writes
from zerda_store.db.aio.psycopg_internals import LoopPipeline
from zerda_store.db.execution.driver import compile_statement
from zerda_store.db.execution.pipeline import write_pipelined
from zerda_store.db.execution.unit_of_work import SESSION_LOCK_NAMESPACE
from zerda_store.db.store import StoreCore

pytestmark = pytest.mark.postgres

PEOPLE = ["Sarah Chen", "Omar Haddad"]


def _step(store: StoreCore, sql: str, **values: Any) -> tuple[Any, dict[str, Any]]:
    statement = sa.text(sql).bindparams(*(sa.bindparam(name, type_=sa.Integer) for name in values))
    return compile_statement(statement.columns(sa.column("value")), store.engine.dialect), values


def _rows(store: StoreCore, sql: str) -> list[Any]:
    with store.connect() as connection:
        return [row[0] for row in connection.execute(sa.text(sql))]


def _backend_pid(store: StoreCore) -> int:
    work = _step(store, "SELECT pg_backend_pid() AS value")[0]
    return int(store.read(lambda transaction: transaction.run(work)[0].value))


@pytest.fixture
def probe(postgres_url: str) -> StoreCore:
    """A store over a database with a ``probe`` table, and one connection left idle."""
    store = StoreCore(postgres_url)
    with store.connect() as connection:
        connection.execute(sa.text("CREATE TABLE probe (id int)"))
        connection.commit()
    _backend_pid(store)
    return store


def test_an_async_turn_reaches_no_database_thread(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store, auto_migrate=True)
        memory.save_context({"input": "Sarah Chen called"}, {"output": "ok"})  # rules checked
        threads = CountedThreads(store, monkeypatch)

        async def turns() -> str:
            memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store)
            await memory.asave_context(
                {"input": "Sarah Chen renewed"}, {"output": "noted"}, idempotency_key="m1"
            )
            await memory.asave_context(  # a retry: stored once
                {"input": "Sarah Chen renewed"}, {"output": "noted"}, idempotency_key="m1"
            )
            await memory.asave_context({"input": "Omar Haddad asked"}, {"output": "answered"})
            recalled = await memory.aload_memory_variables({"input": "Sarah Chen and Omar Haddad?"})
            return str(recalled["entity_info"])

        shown = asyncio.run(turns())
        stats = memory.get_memory_stats()

    assert shown == (
        "Previous information about Sarah Chen:\nSarah Chen called ok\nSarah Chen renewed noted"
        "\n\nPrevious information about Omar Haddad:\nOmar Haddad asked answered"
    )
    assert stats["message_count"] == 3
    assert threads.calls == 0


def test_a_write_is_sent_whole_and_committed_while_the_event_loop_is_busy(
    probe: StoreCore, postgres_url: str
) -> None:
    # A parameter larger than the socket's buffer: libpq holds what the socket did not take.
    large = sa.text("SELECT length(:text) AS value").bindparams(sa.bindparam("text", type_=sa.Text))
    steps = [
        _step(probe, "INSERT INTO probe VALUES (1)"),
        (compile_statement(large, probe.engine.dialect), {"text": "x" * 30_000_000}),
        _step(probe, "SELECT pg_sleep(0.3) IS NULL AS value"),
        _step(probe, "INSERT INTO probe VALUES (2) RETURNING id AS value"),
    ]
    seen: dict[str, Any] = {}

    async def busy() -> Any:
        task = asyncio.create_task(loop_writes.write(probe, steps, lambda rows: True))
        await asyncio.sleep(0)  # the write runs until it awaits its answers
        time.sleep(2.0)  # the loop is busy: nothing of the write runs meanwhile
        with probe.connect() as connection:
            seen["committed"] = connection.execute(sa.text("SELECT count(*) FROM probe")).scalar()
            seen["idle in transaction"] = connection.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND state = 'idle in transaction'"
                )
            ).scalar()
        return await task

    rows = asyncio.run(busy())

    assert seen == {"committed": 2, "idle in transaction": 0}
    assert [row.value for row in rows] == [2]
    probe.close()


def test_a_cancelled_save_sent_nothing_or_stored_its_turn(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save's pipeline goes out before its first await: a cancellation that finds it
    waiting for its answer gets CancelledAfterCommitError, and the turn is stored."""
    with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store, auto_migrate=True)
        memory.save_context({"input": "Sarah Chen called"}, {"output": "ok"})
        answers = LoopPipeline.answers

        async def slow_answers(self: LoopPipeline) -> None:
            await asyncio.sleep(0.5)
            await answers(self)

        monkeypatch.setattr(LoopPipeline, "answers", slow_answers)

        async def cancelled() -> None:
            memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store)
            task = asyncio.create_task(
                memory.asave_context(
                    {"input": "Omar Haddad"}, {"output": "ok"}, idempotency_key="c"
                )
            )
            await asyncio.sleep(0.2)
            task.cancel()
            await asyncio.sleep(0.1)
            task.cancel()  # a second cancellation does not stop the wait for the commit
            with pytest.raises(CancelledAfterCommitError):
                await task

        asyncio.run(cancelled())
        monkeypatch.undo()

        assert memory.get_memory_stats()["message_count"] == 2
        assert memory.get_entity_info("Omar Haddad") is not None


def test_a_write_cancelled_after_its_sync_reports_what_it_stored(probe: StoreCore) -> None:
    steps = [
        _step(probe, "INSERT INTO probe VALUES (1)"),
        _step(probe, "SELECT pg_sleep(0.8) IS NULL AS value"),
    ]

    async def cancelled() -> None:
        task = asyncio.create_task(loop_writes.write(probe, steps, lambda rows: True))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(CancelledAfterCommitError):
            await task

    asyncio.run(cancelled())

    assert _rows(probe, "SELECT id FROM probe") == [1]
    probe.close()


def test_an_error_the_server_reports_rolls_back_and_is_raised_as_on_a_thread(
    probe: StoreCore,
) -> None:
    steps = [_step(probe, "INSERT INTO probe VALUES (1)"), _step(probe, "SELECT 1 / 0 AS value")]
    with pytest.raises(StoreError) as on_thread:
        write_pipelined(probe, steps)
    first = _backend_pid(probe)

    with pytest.raises(StoreError) as on_loop:
        asyncio.run(loop_writes.write(probe, steps, lambda rows: True))

    assert type(on_loop.value) is type(on_thread.value)
    assert str(on_loop.value) == str(on_thread.value)
    assert _rows(probe, "SELECT id FROM probe") == []
    assert _backend_pid(probe) != first  # the connection was dropped
    probe.close()


def test_a_save_that_times_out_on_its_lock_is_not_run_again_on_a_thread(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error that another attempt would meet again is raised from the event loop's
    attempt: the save waits for its lock once, not once more on a thread."""
    with StoreCore(postgres_url, lock_timeout=0.5) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store, auto_migrate=True)
        memory.save_context({"input": "Sarah Chen called"}, {"output": "ok"})
        threads = CountedThreads(store, monkeypatch)
        lock = sa.text("SELECT pg_advisory_lock(:namespace, hashtext(:session))")
        with store.connect() as holder:
            values = {"namespace": SESSION_LOCK_NAMESPACE, "session": memory.session_id}
            holder.execute(lock, values)  # held exclusively: a save's shared lock waits

            async def save() -> None:
                memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store)
                await memory.asave_context({"input": "Omar Haddad"}, {"output": "ok"})

            with pytest.raises(LockTimeoutError):
                asyncio.run(save())
            holder.rollback()
        assert threads.calls == 0
        assert memory.get_memory_stats()["message_count"] == 1


def test_a_write_goes_whole_and_its_connection_is_kept(probe: StoreCore) -> None:
    first = _backend_pid(probe)
    steps = [
        _step(probe, "INSERT INTO probe VALUES (:one)", one=1),
        _step(probe, "INSERT INTO probe VALUES (2) RETURNING id AS value"),
    ]

    rows = asyncio.run(loop_writes.write(probe, steps, lambda rows: True))

    assert [row.value for row in rows] == [2]  # type: ignore[union-attr]
    assert sorted(_rows(probe, "SELECT id FROM probe")) == [1, 2]
    assert _backend_pid(probe) == first
    probe.close()
