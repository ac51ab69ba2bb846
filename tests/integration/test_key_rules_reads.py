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


# -- the fourth hardening round, H12: characters that change no letter ------------------------

IGNORABLE = {
    "variation selector": "Sarah\ufe0f",
    "variation selector supplement": "Sar\U000e0100ah",
    "tag characters": "Sarah\U000e0041\U000e007f",
    "Hangul filler": "Sarah\u3164",
    "halfwidth Hangul filler": "\uffa0Sarah",
    "combining grapheme joiner": "Sa\u034frah",
}


@pytest.mark.parametrize("look_alike", list(IGNORABLE.values()), ids=list(IGNORABLE))
def test_a_look_alike_name_of_invisible_characters_names_the_same_entity(make_memory, look_alike):

    memory = make_memory(FixedLLM("Sarah"), session_id="look-alike")
    memory.save_context({"input": "Sarah called"}, {"output": "ok"})
    spoofed = make_memory(FixedLLM(look_alike), session_id="look-alike")
    spoofed.save_context({"input": "she called again"}, {"output": "ok"})

    assert memory.list_entities() == ["Sarah"]
    assert memory.get_entity_info("Sarah")["contexts_count"] == 2


@pytest.mark.parametrize("look_alike", list(IGNORABLE.values()), ids=list(IGNORABLE))
def test_an_extractors_look_alike_name_names_the_same_entity(make_memory, look_alike):
    class Listing:
        name = "listing"

        def __init__(self, name: str) -> None:
            self._name = name

        def extract(self, text: str) -> list[tuple[str, str]]:
            return [(self._name, "PERSON")]

    make_memory(extractor=Listing("Sarah"), session_id="x").save_context({"input": "a"}, {})
    memory = make_memory(extractor=Listing(look_alike), session_id="x")
    memory.save_context({"input": "b"}, {})

    assert memory.list_entities() == ["Sarah"]


@pytest.mark.parametrize("normalize_names", [True, False], ids=["folded", "exact"])
@pytest.mark.parametrize("look_alike", list(IGNORABLE.values()), ids=list(IGNORABLE))
def test_a_lookup_by_a_look_alike_name_finds_the_entity_extraction_stored(
    make_memory, look_alike, normalize_names
):
    """The names a caller gives are cleaned as extraction cleans the names it finds
    (``without_ignorables``): a lookup by a look-alike finds the entity, with either key
    rules, by every read and change by name."""
    memory = make_memory(FixedLLM("Sarah"), session_id="s", normalize_names=normalize_names)
    memory.save_context({"input": "Sarah called"}, {"output": "ok"})
    make_memory(FixedLLM("Bob"), session_id="s", normalize_names=normalize_names).save_context(
        {"input": "Bob called"}, {"output": "ok"}
    )
    bob = "Bob\u3164"

    assert memory.get_entity_info(look_alike)["name"] == "Sarah"
    assert look_alike in memory.entity_store
    assert memory.entity_store[look_alike].name == "Sarah"
    assert memory.add_alias(look_alike, "Sally\ufe0f") is True
    assert memory.get_entity_info("Sally")["name"] == "Sarah"
    assert memory.remove_alias("Sally\U000e0041") is True
    assert memory.forget_entity(look_alike, dry_run=True)["entities"] == 1
    receipt = memory.merge_entities(look_alike, bob)
    assert (receipt["kept"], receipt["merged"]) == ("Sarah", "Bob")
    assert memory.forget_entity(look_alike)["entities"] == 1
    assert memory.list_entities() == []


def test_an_async_lookup_by_a_look_alike_name_finds_the_entity(make_memory):
    memory = make_memory(FixedLLM("Sarah"), session_id="s")
    memory.save_context({"input": "Sarah called"}, {"output": "ok"})

    async def look_up() -> tuple[dict | None, dict]:
        info = await memory.aget_entity_info("Sarah\ufe0f")
        return info, await memory.aforget_entity("Sarah\ufe0f", dry_run=True)

    info, receipt = asyncio.run(look_up())
    assert info is not None and info["name"] == "Sarah"
    assert receipt["entities"] == 1
