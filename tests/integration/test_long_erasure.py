"""A long erasure runs in batches (the fourth hardening round, H9): forgetting a person
named in more turns than one batch holds gives the receipt one transaction gave, and
other sessions' saves never wait for more than a batch meanwhile (on SQLite they wait for
the one writer: a 44-second erasure failed every other customer's save)."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.store import core_of
from zerda_store.turns import erasure_plan

TURNS = 23  # more than four batches of five


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(erasure_plan, "ERASURE_BATCH", 5)


def _named_in_many_turns(make_memory) -> ConversationEntityMemory:
    memory = make_memory(KeywordLLM(["Sarah", "Omar", "Tom"]))
    memory.save_contexts(
        [({"input": f"Sarah and Tom, call {n}"}, {"output": "ok"}) for n in range(TURNS)]
    )
    memory.save_context({"input": "Omar alone"}, {"output": "ok"})
    memory.save_context({"input": "Tom alone"}, {"output": "ok"})
    return memory


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_long_erasure_with_turns_in_batches_erases_everything(
    make_memory, small_batches, asynchronous
):
    import asyncio

    memory = _named_in_many_turns(make_memory)

    if asynchronous:
        receipt = asyncio.run(memory.aforget_entity("Sarah", with_turns=True))
    else:
        receipt = memory.forget_entity("Sarah", with_turns=True)

    assert receipt == {
        "entity": "Sarah",
        "entities": 1,
        "contexts": 2 * TURNS,
        "turns_deleted": TURNS,
        "turns_updated": 0,
    }
    assert sorted(memory.list_entities()) == ["Omar", "Tom"]
    assert [turn["input"] for turn in memory.chat_memory] == ["Omar alone", "Tom alone"]


def test_a_long_erasure_without_turns_in_batches_rewrites_every_turn(make_memory, small_batches):
    memory = _named_in_many_turns(make_memory)

    receipt = memory.forget_entity("Sarah")

    assert (receipt["entities"], receipt["contexts"], receipt["turns_updated"]) == (1, TURNS, TURNS)
    assert all("Sarah" not in turn["entities"] for turn in memory.chat_memory)
    assert len(memory.chat_memory) == TURNS + 2


def _slow_deletes(store: Store, seconds: float) -> None:
    """Every turn this store's connections delete costs ``seconds`` (a temporary trigger
    calling a function that sleeps), as a million turns with their cascades cost time."""

    def on_connect(connection, _record) -> None:
        connection.create_function("pause", 0, lambda: time.sleep(seconds))
        connection.execute(
            "CREATE TEMP TRIGGER slow_delete AFTER DELETE ON main.turns BEGIN SELECT pause(); END"
        )

    sa.event.listen(store.engine, "connect", on_connect)


def test_other_sessions_save_while_a_long_erasure_runs(sqlite_url, small_batches):
    """SQLite (one writer): every other session's save goes through within its one-second
    lock timeout while a 2.3-second erasure runs."""
    with Store(sqlite_url) as erasing_store, Store(sqlite_url, lock_timeout=1.0) as store:
        memory = _named_in_many_turns(
            lambda llm: ConversationEntityMemory(llm, store=erasing_store)
        )
        _slow_deletes(erasing_store, 0.1)
        core_of(erasing_store).drop_connections()
        done = threading.Event()
        erasing = threading.Thread(
            target=lambda: (memory.forget_entity("Sarah", with_turns=True), done.set())
        )
        other = ConversationEntityMemory(KeywordLLM(["Ann"]), store=store, session_id="other")
        other.save_context({"input": "Ann, first call"}, {"output": "ok"})
        erasing.start()
        saved = 1
        while not done.is_set() and erasing.is_alive():
            other.save_context({"input": f"Ann, call {saved}"}, {"output": "ok"})
            saved += 1
            time.sleep(0.05)
        erasing.join()
        assert done.is_set()
        assert saved > 3
        assert len(other.chat_memory) == saved
        assert memory.list_entities() == ["Tom", "Omar"]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_dry_run_of_forget_says_what_it_would_delete_and_deletes_nothing(
    make_memory, asynchronous
):
    import asyncio

    memory = _named_in_many_turns(make_memory)
    before = (memory.list_entities(), len(memory.chat_memory))

    if asynchronous:
        planned = asyncio.run(memory.aforget_entity("Sarah", with_turns=True, dry_run=True))
    else:
        planned = memory.forget_entity("Sarah", with_turns=True, dry_run=True)

    assert (planned["entities"], planned["turns_deleted"]) == (1, TURNS)
    assert (memory.list_entities(), len(memory.chat_memory)) == before
    assert memory.forget_entity("Sarah", with_turns=True) == planned
