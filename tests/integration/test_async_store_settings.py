"""The async path under the store's settings: a read-only store refuses async writes
before any model call and the connections of its async calls cannot write, they get the
same session settings (lock timeout, read-only, schema), async saves record each
snippet's ``created_at``, and async reads hide what a retention policy expired exactly as
the sync reads do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import Clock, KeywordLLM
from zerda_store import (
    ConversationEntityMemory,
    DatabaseUnavailableError,
    ReadOnlyStoreError,
    Store,
)
from zerda_store.db.execution.driver import compile_statement
from zerda_store.db.execution.unit_of_work import Transaction
from zerda_store.db.store import core_of

NAMES = ("Sarah", "Acme Corp", "Berlin", "Omar")

pytestmark = pytest.mark.asyncio


def _rows(database_url: str, sql: str) -> list[Any]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return list(connection.exec_driver_sql(sql))
    finally:
        engine.dispose()


def _saved(database_url: str) -> None:
    with ConversationEntityMemory(KeywordLLM(NAMES), database_url=database_url) as memory:
        memory.save_context({"input": "Sarah met Omar"}, {"output": "noted"})


ASYNC_WRITES: list[Callable[[ConversationEntityMemory], Awaitable[Any]]] = [
    lambda memory: memory.asave_context({"input": "Sarah again"}, {"output": "ok"}),
    lambda memory: memory.asave_context(
        {"input": "Sarah again"}, {"output": "ok"}, idempotency_key="k1"
    ),
    lambda memory: memory.aforget_entity("Omar"),
    lambda memory: memory.aclear(),
    lambda memory: memory.areextract(),
]


@pytest.mark.parametrize(
    "write", ASYNC_WRITES, ids=["asave_context", "keyed", "aforget_entity", "aclear", "areextract"]
)
async def test_async_writes_through_a_read_only_store_are_refused(database_url, write) -> None:
    _saved(database_url)
    before = _rows(database_url, "SELECT count(*) FROM contexts")
    llm = KeywordLLM(NAMES)
    async with Store(database_url, read_only=True) as store:
        memory = ConversationEntityMemory(llm, store=store)
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            await write(memory)
        assert await memory.alist_entities() == ["Sarah", "Omar"]
        recalled = (await memory.aload_memory_variables({"input": "Sarah?"}))["entity_info"]
        assert "Sarah met Omar noted" in recalled
    assert llm.calls == 1  # the recall's extraction only
    assert _rows(database_url, "SELECT count(*) FROM contexts") == before


async def test_the_async_connections_of_a_read_only_store_cannot_write(database_url) -> None:
    _saved(database_url)
    async with Store(database_url, read_only=True) as store:
        delete = compile_statement(sa.text("DELETE FROM contexts"), store.engine.dialect)

        def write(transaction: Transaction) -> Any:
            return transaction.run(delete)

        with pytest.raises(ReadOnlyStoreError):
            # past the store's own check: the database refuses it
            await core_of(store).aread(write, snapshot=False)
    assert _rows(database_url, "SELECT count(*) FROM contexts")[0][0] == 2


@pytest.mark.postgres
async def test_the_async_pool_gets_the_session_settings(postgres_url: str) -> None:
    _saved(postgres_url)
    async with Store(postgres_url, read_only=True, lock_timeout=1.5, schema="public") as store:
        query = compile_statement(
            sa.text(
                "SELECT current_setting('lock_timeout') AS lock_timeout, "
                "current_setting('default_transaction_read_only') AS read_only, "
                "current_setting('search_path') AS search_path"
            ),
            store.engine.dialect,
        )

        def settings(transaction: Transaction) -> list[Any]:
            return transaction.run(query)

        [row] = await core_of(store).aread(settings)
    assert (row.lock_timeout, row.read_only, row.search_path) == ("1500ms", "on", "public")


async def test_async_saves_record_when_each_snippet_was_made(store_url: str) -> None:
    clock = Clock()
    async with Store(store_url) as store:
        memory = ConversationEntityMemory(KeywordLLM(NAMES), store=store, clock=clock)
        await memory.asave_context({"input": "Sarah met Omar"}, {"output": "ok"})
        clock.now += 10
        await memory.asave_context({"input": "Sarah again"}, {"output": "ok"})
    created = [row[0] for row in _rows(store_url, "SELECT created_at FROM contexts ORDER BY id")]
    assert created == [clock.now - 10, clock.now - 10, clock.now]


@pytest.fixture
def store_url(database_url: str) -> str:
    return database_url


async def test_async_reads_hide_what_a_policy_expired_as_the_sync_reads_do(
    database_url: str,
) -> None:
    clock = Clock()
    async with Store(database_url) as store:
        memory = ConversationEntityMemory(
            KeywordLLM(NAMES), store=store, session_id="r", clock=clock
        )
        await memory.asave_context({"input": "Omar in Berlin"}, {"output": "ok"})
        clock.now += 100
        for n in range(3):
            await memory.asave_context({"input": f"Sarah call {n}"}, {"output": "ok"})
            clock.now += 10
        memory.set_retention(keep_last=2, max_age=60)

        def sync_view() -> tuple[Any, ...]:
            return (
                memory.load_memory_variables({"input": "Sarah, Omar?"}),
                memory.get_entity_info("Sarah"),
                memory.get_entity_info("Omar"),
                memory.get_memory_stats(),
                memory.list_entities(),
            )

        async def async_view() -> tuple[Any, ...]:
            return (
                await memory.aload_memory_variables({"input": "Sarah, Omar?"}),
                await memory.aget_entity_info("Sarah"),
                await memory.aget_entity_info("Omar"),
                await memory.aget_memory_stats(),
                await memory.alist_entities(),
            )

        seen = await async_view()
        assert seen == sync_view()
        variables, sarah, omar, stats, names = seen
        assert "Omar" not in variables["entity_info"]
        assert "Sarah call 0" not in variables["entity_info"]
        assert "Sarah call 2 ok" in variables["entity_info"]
        assert sarah["contexts_count"] == 2 and omar is None
        assert (stats["entity_count"], stats["total_contexts"]) == (1, 2)
        assert names == ["Sarah"]

        memory.clear_retention()
        assert (await memory.aget_entity_info("Omar"))["contexts_count"] == 1


@pytest.mark.postgres
async def test_a_database_the_async_pool_cannot_reach_is_unavailable_its_password_masked() -> None:
    secret = "s3cr3t-Pa55"
    async with Store(f"postgresql://zerda:{secret}@127.0.0.1:1/nowhere") as store:
        with pytest.raises(DatabaseUnavailableError, match="cannot connect") as caught:
            await core_of(store).aread(lambda transaction: None)
    assert secret not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
