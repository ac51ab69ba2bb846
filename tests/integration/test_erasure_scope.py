"""Forgetting with turns removes the other entities of those turns only when they are
left with no snippet, and nothing else in the session."""

from __future__ import annotations

import pytest

from tests.support import KeywordLLM
from zerda_store import Store, StoreError
from zerda_store.admin import AdminRepository

GHOST = {
    "kind": "entity",
    "id": 1,
    "name_key": "ghost",
    "name": "Ghost",
    "entity_type": "unknown",
    "first_seen": 1.0,
    "last_seen": 1.0,
    "first_turn_id": 0,
    "first_position": 0,
}


def test_forget_with_turns_leaves_entities_of_other_turns_alone(make_memory, database_url):
    with Store(database_url) as store:
        AdminRepository(store).import_session("default", [GHOST])
    memory = make_memory(KeywordLLM(["Sarah", "Tom", "Omar"]))
    memory.save_context({"input": "Sarah met Tom"}, {"output": "ok"})
    memory.save_context({"input": "Omar met Tom"}, {"output": "ok"})
    memory.save_context({"input": "Sarah alone"}, {"output": "ok"})

    receipt = memory.forget_entity("Sarah", with_turns=True)

    assert receipt["entities"] == 1  # Sarah; Tom keeps the snippet of the Omar turn
    assert memory.list_entities() == ["Ghost", "Tom", "Omar"]
    assert memory.get_entity_info("Tom")["contexts_count"] == 1


def test_forget_with_turns_removes_an_entity_known_only_from_those_turns(make_memory):
    memory = make_memory(KeywordLLM(["Sarah", "Tom"]))
    memory.save_context({"input": "Sarah met Tom"}, {"output": "ok"})
    memory.save_context({"input": "Sarah again"}, {"output": "ok"})

    receipt = memory.forget_entity("Sarah", with_turns=True)

    assert (receipt["entities"], receipt["turns_deleted"], receipt["contexts"]) == (2, 2, 3)
    assert memory.list_entities() == []


def test_records_holding_one_idempotency_key_twice_are_refused_in_one_line(database_url):
    turn = {
        "kind": "turn",
        "id": 1,
        "input_text": "hi",
        "output_text": "ok",
        "entity_names": [],
        "created_at": 1.0,
        "idempotency_key": "twice",
        "extractor": "llm",
        "status": "ok",
        "error": None,
        "latency_ms": 0.0,
        "entity_count": 0,
        "attempts": 1,
        "updated_at": 1.0,
    }
    with Store(database_url) as store:
        admin = AdminRepository(store)
        with pytest.raises(StoreError, match="idempotency key 'twice' more than once"):
            admin.import_session("s", [turn, {**turn, "id": 2}])
        assert not admin.session_exists("s")
