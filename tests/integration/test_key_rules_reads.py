"""A memory whose key rules differ from its session's is refused by reads and changes by
name as by saves (KeyRulesMismatchError), instead of silently finding nothing."""

from __future__ import annotations

import asyncio

import pytest

from tests.doubles import FixedLLM
from zerda_store.errors import KeyRulesMismatchError


@pytest.fixture
def exact_session(make_memory):
    """Session "s" written with ``normalize_names=False``."""
    exact = make_memory(FixedLLM("Sarah"), normalize_names=False, session_id="s")
    exact.save_context({"input": "Sarah joined"}, {"output": "ok"})
    return exact


def test_reads_by_name_with_other_key_rules_are_refused(exact_session, make_memory):
    default = make_memory(FixedLLM("Sarah"), session_id="s")
    for read in (
        lambda: default.load_memory_variables({"input": "Sarah"}),
        lambda: default.get_entity_info("Sarah"),
        lambda: "Sarah" in default.entity_store,
        lambda: default.similar_entities(),
    ):
        with pytest.raises(KeyRulesMismatchError, match="normalize_names=False"):
            read()


def test_changes_by_name_with_other_key_rules_are_refused_and_change_nothing(
    exact_session, make_memory
):
    default = make_memory(FixedLLM("Sarah"), session_id="s")
    for change in (
        lambda: default.forget_entity("Sarah", with_turns=True),
        lambda: default.add_alias("Sarah", "Sally"),
        lambda: default.remove_alias("Sally"),
        lambda: default.merge_entities("Sarah", "Sarah"),
    ):
        with pytest.raises(KeyRulesMismatchError):
            change()
    assert exact_session.get_entity_info("Sarah")["aliases"] == []
    assert len(exact_session.chat_memory) == 1


def test_async_reads_with_other_key_rules_are_refused(exact_session, make_memory):
    default = make_memory(FixedLLM("Sarah"), session_id="s")

    async def reads() -> None:
        for read in (
            default.aload_memory_variables({"input": "Sarah"}),
            default.aget_entity_info("Sarah"),
            default.aforget_entity("Sarah"),
        ):
            with pytest.raises(KeyRulesMismatchError):
                await read
        await default.aclose()

    asyncio.run(reads())
    assert exact_session.list_entities() == ["Sarah"]


def test_the_right_key_rules_read_as_before(exact_session, make_memory):
    same = make_memory(FixedLLM("Sarah"), normalize_names=False, session_id="s")
    assert "Sarah joined" in same.load_memory_variables({"input": "Sarah"})["entity_info"]
    assert same.get_entity_info("Sarah")["name"] == "Sarah"


def test_a_session_never_written_reads_empty_with_any_key_rules(make_memory):
    for normalize in (True, False):
        memory = make_memory(FixedLLM("Sarah"), normalize_names=normalize, session_id="new")
        assert memory.load_memory_variables({"input": "Sarah"})["entity_info"] == ""
        assert memory.get_entity_info("Sarah") is None
