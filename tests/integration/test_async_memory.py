"""The native async API on both backends: the same results as the sync API, async LLMs
awaited on the event loop, sync ones on the store's own threads, cancellation that leaves
no partial turn and returns its connection, and concurrent saves that lose nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from tests.doubles import AsyncKeywordLLM, KeywordLLM, ThreadRecordingLLM, direct_url
from zerda_store import ConversationEntityMemory, Store, StoreError
from zerda_store.db.routes import Route, Routes, unit_of_work_of
from zerda_store.db.store import core_of
from zerda_store.turns.attachment import Attachment

NAMES = ("Sarah", "Acme Corp", "Berlin", "Omar")

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    async with Store(database_url, llm_workers=4) as shared:
        yield shared


def _count(database_url: str, sql: str) -> int:
    engine = sa.create_engine(direct_url(database_url))
    try:
        with engine.connect() as connection:
            return int(connection.exec_driver_sql(sql).scalar_one())
    finally:
        engine.dispose()


async def _in_use(store: Store) -> int:
    return core_of(store).connections_in_use()


async def test_async_api_gives_the_sync_api_results(store: Store) -> None:
    async_memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="a")
    sync_memory = ConversationEntityMemory(KeywordLLM(NAMES), store=store, session_id="s")
    turns = [
        ("Sarah joined Acme Corp", "welcome"),
        ("Omar moved to Berlin", "noted"),
        ("Sarah met Omar in Berlin", "nice"),
    ]
    for text, answer in turns:
        await async_memory.asave_context({"input": text}, {"output": answer})
        await asyncio.to_thread(sync_memory.save_context, {"input": text}, {"output": answer})

    query = {"input": "What about Sarah and Berlin?"}
    recalled = await async_memory.aload_memory_variables(query)
    assert recalled == await asyncio.to_thread(sync_memory.load_memory_variables, query)
    assert "Sarah met Omar in Berlin" in recalled["entity_info"]
    assert await async_memory.alist_entities() == ["Sarah", "Acme Corp", "Omar", "Berlin"]
    info = await async_memory.aget_entity_info("sarah")
    expected = await asyncio.to_thread(sync_memory.get_entity_info, "sarah")
    assert info is not None and expected is not None
    assert (info["name"], info["contexts_count"], info["recent_contexts"]) == (
        expected["name"],
        expected["contexts_count"],
        expected["recent_contexts"],
    )
    assert await async_memory.aget_entity_info("Nobody") is None


async def test_aforget_entity_and_aclear_erase_only_their_session(store: Store) -> None:
    memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="a")
    other = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="b")
    for each in (memory, other):
        await each.asave_context({"input": "Sarah joined Acme Corp"}, {"output": "ok"})
    receipt = await memory.aforget_entity("Sarah")
    assert (receipt["entity"], receipt["entities"], receipt["contexts"]) == ("Sarah", 1, 1)
    assert await memory.alist_entities() == ["Acme Corp"]
    await memory.aclear()
    assert await memory.alist_entities() == []
    assert await other.alist_entities() == ["Sarah", "Acme Corp"]


async def test_areextract_repairs_turns_whose_extraction_failed(store: Store) -> None:
    class Outage(AsyncKeywordLLM):
        down = True

        async def agenerate(self, prompt: str, max_tokens: int = 256) -> str:
            if self.down:
                raise TimeoutError("no answer")
            return await super().agenerate(prompt, max_tokens)

    llm = Outage()
    memory = ConversationEntityMemory(llm, store=store, session_id="r")
    await memory.asave_context({"input": "Sarah called"}, {"output": "ok"})
    assert await memory.alist_entities() == []
    assert memory.get_memory_stats()["extraction_errors"] == 1
    llm.down = False
    assert await memory.areextract() == {"repaired": 1, "failed": 0}
    assert await memory.areextract() == {"repaired": 0, "failed": 0}
    assert await memory.alist_entities() == ["Sarah"]


async def test_an_async_llm_is_awaited_on_the_event_loop(store: Store) -> None:
    llm = AsyncKeywordLLM()
    memory = ConversationEntityMemory(llm, store=store, session_id="loop")
    await memory.asave_context({"input": "Sarah"}, {"output": "ok"})
    await memory.aload_memory_variables({"input": "Sarah"})
    assert llm.threads == {threading.current_thread().name}
    assert llm.sync_calls == 0


async def test_a_sync_llm_runs_on_the_stores_own_threads(store: Store) -> None:
    llm = ThreadRecordingLLM(NAMES)
    memory = ConversationEntityMemory(llm, store=store, session_id="threads")
    await memory.asave_context({"input": "Sarah"}, {"output": "ok"})
    await memory.aload_memory_variables({"input": "Sarah"})
    assert llm.threads and all(name.startswith("zerda-store-llm") for name in llm.threads)


async def test_many_concurrent_saves_on_one_session_lose_nothing(
    store: Store, database_url: str
) -> None:
    memory = ConversationEntityMemory(
        AsyncKeywordLLM([*NAMES, *(f"Client{i:03d}" for i in range(60))], delay=0.01),
        store=store,
        session_id="busy",
    )
    await asyncio.gather(
        *(
            memory.asave_context(
                {"input": f"Sarah and Omar met Client{i:03d}"},
                {"output": "ok"},
                idempotency_key=f"msg-{i}",
            )
            for i in range(60)
        ),
        # Each message delivered twice at once: stored once.
        *(
            memory.asave_context(
                {"input": f"Sarah and Omar met Client{i:03d}"},
                {"output": "ok"},
                idempotency_key=f"msg-{i}",
            )
            for i in range(60)
        ),
    )
    assert (await memory.aget_memory_stats())["message_count"] == 60
    assert len(await memory.alist_entities()) == 62
    sarah = await memory.aget_entity_info("Sarah")
    assert sarah is not None and sarah["contexts_count"] == 60
    duplicates = "SELECT count(*) FROM (SELECT name_key FROM entities GROUP BY session_id, name_key HAVING count(*) > 1) d"
    assert _count(database_url, duplicates) == 0
    assert await _in_use(store) == 0


async def test_cancelled_during_a_slow_llm_stores_nothing(store: Store, database_url: str) -> None:
    memory = ConversationEntityMemory(AsyncKeywordLLM(delay=5), store=store, session_id="c")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(memory.asave_context({"input": "Sarah"}, {"output": "ok"}), 0.2)
    assert _count(database_url, "SELECT count(*) FROM turns") == 0
    assert await _in_use(store) == 0


async def test_cancelled_inside_the_transaction_leaves_no_partial_turn(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="c")
    await memory.asave_context({"input": "Sarah joined"}, {"output": "ok"})
    run = Attachment.run

    def slow_run(self: Attachment, *args: Any, **options: Any) -> None:
        # After the turn's INSERT, before its snippets (on the store's database thread):
        # the awaiting task is cancelled here.
        time.sleep(0.6)
        run(self, *args, **options)

    monkeypatch.setattr(Attachment, "run", slow_run)
    # The general unit of work on Postgres too (not the one-trip pipeline).
    route = Routes.route

    def never_one_trip(self: Routes, *args: Any, **options: Any) -> Route | None:
        chosen = route(self, *args, **options)
        return unit_of_work_of(chosen)

    monkeypatch.setattr(Routes, "route", never_one_trip)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(
            memory.asave_context({"input": "Sarah left"}, {"output": "bye"}), 0.3
        )
    monkeypatch.undo()

    assert await _in_use(store) == 0
    assert _count(database_url, "SELECT count(*) FROM turns") == 1
    assert _count(database_url, "SELECT count(*) FROM contexts") == 1
    # The connection it gave back is clean: the next saves go through.
    await memory.asave_context({"input": "Sarah came back"}, {"output": "hi"})
    await asyncio.gather(
        *(memory.asave_context({"input": f"Sarah {i}"}, {"output": "ok"}) for i in range(12))
    )
    assert (await memory.aget_memory_stats())["message_count"] == 14


async def test_a_store_works_again_from_a_new_event_loop(database_url: str) -> None:
    store = Store(database_url)
    memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="loops")
    await memory.asave_context({"input": "Sarah"}, {"output": "ok"})

    def in_another_loop() -> list[str]:
        async def run() -> list[str]:
            await memory.asave_context({"input": "Omar"}, {"output": "ok"})
            return await memory.alist_entities()

        return asyncio.run(run())

    assert await asyncio.to_thread(in_another_loop) == ["Sarah", "Omar"]
    store.close()


async def test_aclose_closes_the_store_for_async_and_sync_use(database_url: str) -> None:
    store = Store(database_url)
    memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="x")
    await memory.asave_context({"input": "Sarah"}, {"output": "ok"})
    await store.aclose()
    with pytest.raises(StoreError, match="closed"):
        await memory.asave_context({"input": "Sarah"}, {"output": "ok"})
    with pytest.raises(StoreError, match="closed"):
        memory.save_context({"input": "Sarah"}, {"output": "ok"})


async def test_async_with_on_a_memory_closes_the_store_it_opened(database_url: str) -> None:
    async with ConversationEntityMemory(
        AsyncKeywordLLM(), database_url=database_url, session_id="w"
    ) as memory:
        await memory.asave_context({"input": "Sarah"}, {"output": "ok"})
    assert memory.store.closed
    assert _count(database_url, "SELECT count(*) FROM turns") == 1
