"""Postgres: the async path's one-statement reads (a turn's recall, its idempotency key's
check) are sent from the event loop on an idle connection, with no database thread; a
connection the server closed, a driver error and a cancellation each leave the store as
the thread path would.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import AsyncKeywordLLM, CountedThreads
from zerda_store import ConversationEntityMemory, StoreError
from zerda_store.db.aio import loop_reads
from zerda_store.db.execution.driver import compile_statement
from zerda_store.db.execution.unit_of_work import OneStatement
from zerda_store.db.store import StoreCore

pytestmark = pytest.mark.postgres

PEOPLE = ["Sarah Chen", "Omar Haddad"]


def _statement(store: StoreCore, sql: str) -> Any:
    return compile_statement(sa.text(sql).columns(sa.column("value")), store.engine.dialect)


def _one(store: StoreCore, sql: str) -> OneStatement[Any]:
    return OneStatement(_statement(store, sql), {}, lambda rows: rows[0].value)


def test_a_turns_reads_go_from_the_event_loop_without_a_thread(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store, auto_migrate=True)
        memory.save_context({"input": "Sarah Chen renewed"}, {"output": "ok"}, idempotency_key="m1")
        threads = CountedThreads(store, monkeypatch)

        async def turn() -> str:
            memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store)
            recalled = await memory.aload_memory_variables({"input": "How is Sarah Chen?"})
            # A retried message: its key's check finds it, and nothing is saved again.
            await memory.asave_context(
                {"input": "Sarah Chen renewed"}, {"output": "ok"}, idempotency_key="m1"
            )
            return str(recalled["entity_info"])

        shown = asyncio.run(turn())

    assert shown == "Previous information about Sarah Chen:\nSarah Chen renewed ok"
    assert threads.reads == 0


def test_a_connection_the_server_closed_while_idle_is_replaced(
    postgres_url: str, postgres_admin: sa.Engine
) -> None:
    with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store, auto_migrate=True)
        memory.save_context({"input": "Omar Haddad called"}, {"output": "ok"})
        database = sa.make_url(postgres_url).database
        with postgres_admin.connect() as admin:
            ended = admin.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity, pg_terminate_backend(pid) "
                    "WHERE datname = :database AND pid <> pg_backend_pid()"
                ),
                {"database": database},
            ).scalar_one()
        assert ended >= 1

        recalled = asyncio.run(memory.aload_memory_variables({"input": "Omar Haddad?"}))

    assert recalled["entity_info"].endswith("Omar Haddad called ok")


def test_a_driver_error_is_raised_as_the_thread_path_raises_it(postgres_url: str) -> None:
    with StoreCore(postgres_url) as store:
        work = _one(store, "SELECT 1 / 0 AS value")
        with pytest.raises(StoreError) as on_thread:
            store.read(work)
        store.read(_one(store, "SELECT 1 AS value"))  # a connection left idle

        with pytest.raises(StoreError) as on_loop:
            asyncio.run(loop_reads.read(store, work))

        assert type(on_loop.value) is type(on_thread.value)
        assert str(on_loop.value) == str(on_thread.value)
        assert asyncio.run(loop_reads.read(store, _one(store, "SELECT 2 AS value"))) == 2


def test_a_cancelled_read_drops_its_connection(postgres_url: str) -> None:
    with StoreCore(postgres_url) as store:
        pid = _one(store, "SELECT pg_backend_pid() AS value")
        first = store.read(pid)  # the one connection, left idle

        async def cancelled() -> None:
            task = asyncio.create_task(
                loop_reads.read(store, _one(store, "SELECT pg_sleep(30) IS NULL AS value"))
            )
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled())
        after = asyncio.run(loop_reads.read(store, pid))

    assert after != first


def test_a_wave_of_reads_finds_as_many_idle_connections_as_the_pool_keeps(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service's requests come in waves: a store keeps idle up to its pool's size of
    connections, so that a wave of reads goes from the event loop, not to threads."""
    wave = 8
    with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store, auto_migrate=True)
        memory.save_context({"input": "Sarah Chen renewed"}, {"output": "ok"})

        async def turns() -> list[str]:
            # ``wave`` connections at once on the database threads, then all left idle.
            await asyncio.gather(*(store.aread(lambda _: time.sleep(0.3)) for _ in range(wave)))
            threads = CountedThreads(store, monkeypatch)
            memories = [
                ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store) for _ in range(wave)
            ]
            recalled = await asyncio.gather(
                *(m.aload_memory_variables({"input": "Sarah Chen?"}) for m in memories)
            )
            assert threads.reads == 0
            return [str(r["entity_info"]) for r in recalled]

        shown = asyncio.run(turns())

    assert set(shown) == {"Previous information about Sarah Chen:\nSarah Chen renewed ok"}
