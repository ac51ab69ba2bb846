"""The memory over a fake repository: what it hands the repository and how it shows what
comes back, with no database (the memory orchestrates; the repository stores)."""

from __future__ import annotations

import itertools
from typing import Any

from tests.doubles import FakeRepository, FakeStore, KeywordLLM, NoPolicy
from zerda_store import ConversationEntityMemory
from zerda_store.memory.base import MemoryParts


def memory_over(repository: FakeRepository, **options: Any) -> ConversationEntityMemory:
    parts = MemoryParts(
        FakeStore(),  # type: ignore[arg-type]
        repository,  # type: ignore[arg-type]
        identity=None,  # type: ignore[arg-type]
        erasure=None,  # type: ignore[arg-type]
        ledger=None,  # type: ignore[arg-type]
        policies=None,  # type: ignore[arg-type]
        policy=NoPolicy(),  # type: ignore[arg-type]
    )
    return ConversationEntityMemory(parts=parts, **options)


def test_a_save_hands_the_repository_one_turn_with_its_mentions_and_the_clocks_time():
    repository = FakeRepository()
    memory = memory_over(
        repository, llm=KeywordLLM(["Sarah", "Acme Corp"]), session_id="s1", clock=lambda: 42.0
    )

    memory.save_context({"input": "Sarah joined Acme Corp"}, {"output": "noted"})

    [(session_id, turn)] = repository.turns
    assert session_id == "s1"
    assert (turn.input_text, turn.output_text, turn.created_at) == (
        "Sarah joined Acme Corp",
        "noted",
        42.0,
    )
    assert [(m.name, m.key) for m in turn.mentions] == [
        ("Sarah", "sarah"),
        ("Acme Corp", "acme corp"),
    ]
    assert turn.outcome.status == "ok"


def test_a_load_recalls_the_mentioned_keys_and_shows_one_block_per_entity():
    repository = FakeRepository()
    memory = memory_over(repository, llm=KeywordLLM(["Sarah", "Omar"]))
    memory.save_context({"input": "Sarah called"}, {"output": "ok"})
    memory.save_context({"input": "Omar and Sarah met"}, {"output": "fine"})

    shown = memory.load_memory_variables({"input": "What about Sarah?"})

    assert repository.recalls == [("default", ["sarah"], 3, None)]
    assert shown == {
        "entity_info": "Previous information about Sarah:\nSarah called ok\nOmar and Sarah met fine"
    }


def test_an_idempotency_key_seen_before_saves_nothing_again():
    repository = FakeRepository()
    memory = memory_over(repository, llm=KeywordLLM(["Sarah"]))
    for _ in range(2):
        memory.save_context({"input": "Sarah"}, {"output": "ok"}, idempotency_key="turn-1")
    assert len(repository.turns) == 1


def test_each_save_reads_the_clock_it_was_given():
    ticks = itertools.count(1000.0, 10.0)
    repository = FakeRepository()
    memory = memory_over(repository, llm=KeywordLLM(["Sarah"]), clock=lambda: next(ticks))
    memory.save_context({"input": "Sarah one"}, {"output": "ok"})
    memory.save_context({"input": "Sarah two"}, {"output": "ok"})
    assert [turn.created_at for _, turn in repository.turns] == [1000.0, 1010.0]


def test_a_memory_on_given_parts_does_not_close_their_store():
    repository = FakeRepository()
    memory = memory_over(repository)
    memory.close()
    assert not memory.store.closed
