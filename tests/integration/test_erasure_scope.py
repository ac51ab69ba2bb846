"""Forgetting with turns removes the other entities of those turns only when they are
left with no snippet, and nothing else in the session."""

from __future__ import annotations

import pytest

from tests.doubles import KeywordLLM, OutageLLM, say
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


def test_forget_with_turns_deletes_failed_turns_that_mention_the_name(make_memory):
    llm = OutageLLM(["Jane Doe", "Omar"])
    memory = make_memory(llm)
    llm.down = True
    say(memory, "Jane Doe called about the invoice", "failed 1")
    say(memory, "Omar phoned", "failed 2")
    llm.down = False
    say(memory, "Jane Doe signed the contract", "good 1")
    say(memory, "Omar asked about pricing", "good 2")
    assert memory.list_entities() == ["Jane Doe", "Omar"]

    receipt = memory.forget_entity("Jane Doe", with_turns=True)

    assert receipt == {
        "entity": "Jane Doe",
        "entities": 1,
        "contexts": 1,
        "turns_deleted": 2,
        "turns_updated": 0,
    }
    assert [turn["output"] for turn in memory.chat_memory] == ["failed 2", "good 2"]

    assert memory.reextract() == {"repaired": 1, "failed": 0}

    assert memory.list_entities() == ["Omar"]
    assert "Jane Doe" not in memory.entity_store
    assert memory.get_entity_info("Jane Doe") is None
    assert memory.get_entity_info("Omar")["recent_contexts"] == [
        "Omar phoned failed 2",
        "Omar asked about pricing good 2",
    ]
    assert [turn["entities"] for turn in memory.chat_memory] == [["Omar"], ["Omar"]]


def test_forget_with_turns_keeps_failed_turns_where_the_name_is_only_part_of_a_word(
    make_memory,
):
    llm = OutageLLM(["Ann"])
    memory = make_memory(llm)
    say(memory, "Ann joined", "good")
    llm.down = True
    say(memory, "The annual report is due on Friday", "failed")

    receipt = memory.forget_entity("Ann", with_turns=True)

    assert receipt["turns_deleted"] == 1
    assert [turn["output"] for turn in memory.chat_memory] == ["failed"]


def test_forget_without_turns_leaves_failed_turns_in_place(make_memory):
    llm = OutageLLM(["Jane Doe"])
    memory = make_memory(llm)
    llm.down = True
    say(memory, "Jane Doe called", "failed")
    llm.down = False
    say(memory, "Jane Doe signed", "good")

    receipt = memory.forget_entity("Jane Doe")

    assert (receipt["turns_deleted"], receipt["turns_updated"]) == (0, 1)
    assert [turn["output"] for turn in memory.chat_memory] == ["failed", "good"]


def test_forget_with_turns_after_a_forget_without_reaches_the_turns_naming_the_person(
    make_memory,
):
    memory = make_memory(KeywordLLM(["Sarah Chen", "Tom", "Omar"]))
    memory.save_context({"input": "Sarah Chen met Tom"}, {"output": "ok"})
    memory.save_context({"input": "Omar alone"}, {"output": "ok"})
    memory.save_context({"input": "sarah chen called again"}, {"output": "ok"})
    memory.forget_entity("Sarah Chen")  # the turn texts stay
    assert memory.list_entities() == ["Tom", "Omar"]

    receipt = memory.forget_entity("Sarah Chen", with_turns=True)

    assert (receipt["turns_deleted"], receipt["entities"], receipt["contexts"]) == (2, 1, 1)
    assert [turn["input"] for turn in memory.chat_memory] == ["Omar alone"]
    assert memory.list_entities() == ["Omar"]  # Tom was known only from a deleted turn
    assert memory.forget_entity("Sarah Chen", with_turns=True)["turns_deleted"] == 0
    assert memory.forget_entity("...", with_turns=True)["turns_deleted"] == 0
    assert len(memory.chat_memory) == 1


def test_forget_with_turns_reaches_a_turn_whose_extraction_missed_the_name(make_memory):
    memory = make_memory(KeywordLLM(["Sarah", "Tom"]))
    memory.save_context({"input": "Sarah met Tom"}, {"output": "ok"})
    memory.save_context({"input": "Tom heard SARAH was out"}, {"output": "ok"})

    receipt = memory.forget_entity("Sarah", with_turns=True)

    assert receipt["turns_deleted"] == 2
    assert len(memory.chat_memory) == 0 and memory.list_entities() == []
