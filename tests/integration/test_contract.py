"""One test per behaviour of the design contract, on SQLite and on Postgres."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence

import pytest
import sqlalchemy as sa
from zerda.memory import ConversationEntityMemory as Original

from tests.doubles import (
    BrokenLLM,
    FixedLLM,
    KeywordLLM,
    RecordingLLM,
    ScriptedExtractor,
    direct_url,
    say,
)
from zerda_store import (
    ConversationEntityMemory,
    DatabaseUnavailableError,
    SchemaNotCurrentError,
    Store,
    migrate,
)

ORIGINAL_PROMPT = Original().entity_extraction_prompt


def recall(memory, text):
    return memory.load_memory_variables({"input": text})["entity_info"]


def counts(memory):
    stats = memory.get_memory_stats()
    return stats["entity_count"], stats["message_count"], stats["total_contexts"]


def is_postgres(database_url):
    return database_url.startswith("postgresql")


# -- sessions and lifecycle ---------------------------------------------------------------


def test_sessions_do_not_see_each_others_entities_or_turns(make_memory):
    alice = make_memory(FixedLLM("Sarah"), session_id="alice")
    bob = make_memory(FixedLLM("Sarah, Omar"), session_id="bob")
    say(alice, "Sarah from alice")
    say(bob, "Sarah from bob")

    assert alice.list_entities() == ["Sarah"]
    assert bob.list_entities() == ["Sarah", "Omar"]
    assert alice.get_entity_info("Sarah")["recent_contexts"] == ["Sarah from alice ok"]
    assert alice.get_entity_info("Omar") is None
    assert "Omar" not in alice.entity_store
    assert [turn["input"] for turn in alice.chat_memory] == ["Sarah from alice"]
    assert recall(alice, "Sarah?") == "Previous information about Sarah:\nSarah from alice ok"
    assert counts(alice) == (1, 1, 1)
    assert counts(bob) == (2, 1, 2)


def test_clear_empties_only_its_own_session(make_memory):
    cleared = make_memory(FixedLLM("Sarah"), session_id="cleared")
    kept = make_memory(FixedLLM("Sarah"), session_id="kept")
    say(cleared, "Sarah in cleared")
    say(kept, "Sarah in kept")

    cleared.clear()

    assert cleared.list_entities() == []
    assert len(cleared.chat_memory) == 0
    assert counts(cleared) == (0, 0, 0)
    assert recall(cleared, "Sarah") == ""
    assert counts(kept) == (1, 1, 1)
    assert recall(kept, "Sarah") == "Previous information about Sarah:\nSarah in kept ok"
    say(cleared, "Sarah again")
    assert cleared.get_entity_info("Sarah")["recent_contexts"] == ["Sarah again ok"]


def test_with_block_closes_the_memory_and_keeps_its_data(database_url):
    memory = ConversationEntityMemory(FixedLLM("Sarah"), database_url=database_url)
    with memory as entered:
        assert entered is memory
        say(memory, "Sarah joined")
        assert not memory.store.closed

    assert memory.store.closed
    with ConversationEntityMemory(FixedLLM("Sarah"), database_url=database_url) as reopened:
        assert reopened.list_entities() == ["Sarah"]
        assert recall(reopened, "Sarah") == "Previous information about Sarah:\nSarah joined ok"


def test_async_with_closes_the_memory_and_keeps_its_data(database_url):
    async def scenario():
        memory = ConversationEntityMemory(FixedLLM("Sarah"), database_url=database_url)
        async with memory as entered:
            assert entered is memory
            await memory.asave_context({"input": "Sarah joined"}, {"output": "ok"})
            recalled = await memory.aload_memory_variables({"input": "Sarah"})
        return memory, recalled

    memory, recalled = asyncio.run(scenario())

    assert recalled == {"entity_info": "Previous information about Sarah:\nSarah joined ok"}
    assert memory.store.closed
    with ConversationEntityMemory(FixedLLM("Sarah"), database_url=database_url) as reopened:
        assert counts(reopened) == (1, 1, 1)
        assert list(reopened.chat_memory) == [
            {"input": "Sarah joined", "output": "ok", "entities": ["Sarah"]}
        ]


def test_memories_share_one_store_and_closing_one_leaves_it_open(database_url):
    with Store(database_url) as store:
        first = ConversationEntityMemory(FixedLLM("Sarah"), store=store, session_id="first")
        second = ConversationEntityMemory(FixedLLM("Omar"), store=store, session_id="second")
        assert first.store is store
        assert second.store is store
        say(first, "Sarah joined")

        first.close()
        with ConversationEntityMemory(store=store, session_id="first") as third:
            assert third.list_entities() == ["Sarah"]

        assert not store.closed
        say(second, "Omar joined")
        assert second.list_entities() == ["Omar"]
        assert counts(second) == (1, 1, 1)
        with pytest.raises(ValueError, match="store"):
            ConversationEntityMemory(database_url=database_url, store=store)
    assert store.closed


def test_constructor_takes_the_originals_arguments_in_the_same_order(database_url):
    llm = FixedLLM("Sarah")
    with ConversationEntityMemory(
        llm, "history", "question", "answer", "ar", "Find: {text}", database_url=database_url
    ) as memory:
        assert memory.llm is llm
        assert memory.memory_key == "history"
        assert memory.input_key == "question"
        assert memory.output_key == "answer"
        assert memory.lang == "ar"
        assert memory.entity_extraction_prompt == "Find: {text}"

        memory.save_context({"question": "Sarah?"}, {"answer": "yes"})

        assert list(memory.chat_memory) == [
            {"input": "Sarah?", "output": "yes", "entities": ["Sarah"]}
        ]
        assert memory.load_memory_variables({"question": "Sarah"}) == {
            "history": "معلومات سابقة عن Sarah:\nSarah? yes"
        }


# -- read-only views ----------------------------------------------------------------------


def test_entity_store_is_a_read_only_mapping(make_memory):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah joined")
    entities = memory.entity_store

    assert isinstance(entities, Mapping)
    assert not isinstance(entities, MutableMapping)
    with pytest.raises(TypeError):
        entities["Omar"] = entities["Sarah"]
    with pytest.raises(TypeError):
        del entities["Sarah"]
    assert memory.list_entities() == ["Sarah"]


def test_entity_store_looks_entities_up_by_normalized_name(make_memory):
    memory = make_memory(FixedLLM("Sarah Connor"))
    say(memory, "Sarah Connor joined")

    entity = memory.entity_store["  sarah   CONNOR "]

    assert entity.name == "Sarah Connor"
    assert entity.entity_type == "unknown"
    assert entity.contexts == ["Sarah Connor joined ok"]
    assert "SARAH CONNOR" in memory.entity_store
    assert "Sarah" not in memory.entity_store
    assert 42 not in memory.entity_store
    assert memory.entity_store.get("Omar") is None
    with pytest.raises(KeyError):
        memory.entity_store["Omar"]


def test_entity_store_iterates_in_first_seen_order_and_has_a_length(make_memory):
    memory = make_memory(KeywordLLM(["Zed", "Amy", "Mia", "Bob"]))
    say(memory, "Zed met Amy")
    say(memory, "Mia saw Amy and Bob")

    assert list(memory.entity_store) == ["Zed", "Amy", "Mia", "Bob"]
    assert [entity.name for entity in memory.entity_store.values()] == ["Zed", "Amy", "Mia", "Bob"]
    assert len(memory.entity_store) == 4


def test_chat_memory_is_a_read_only_sequence_of_turns(make_memory):
    memory = make_memory(KeywordLLM(["Sarah", "Omar"]))
    said = ["Sarah one", "Omar two", "nobody three", "Sarah and Omar four"]
    for number, text in enumerate(said):
        say(memory, text, f"answer {number}")
    expected = [
        {"input": "Sarah one", "output": "answer 0", "entities": ["Sarah"]},
        {"input": "Omar two", "output": "answer 1", "entities": ["Omar"]},
        {"input": "nobody three", "output": "answer 2", "entities": []},
        {"input": "Sarah and Omar four", "output": "answer 3", "entities": ["Sarah", "Omar"]},
    ]
    turns = memory.chat_memory

    assert isinstance(turns, Sequence)
    assert not isinstance(turns, MutableSequence)
    assert len(turns) == 4
    assert list(turns) == expected
    assert turns[0] == expected[0]
    assert turns[-1] == expected[-1]
    assert turns[-4] == expected[0]
    assert turns[1:3] == expected[1:3]
    assert turns[-2:] == expected[-2:]
    assert turns[::2] == expected[::2]
    assert turns[::-1] == expected[::-1]
    assert turns[3:1] == []
    assert turns[10:] == []
    with pytest.raises(IndexError):
        turns[4]
    with pytest.raises(IndexError):
        turns[-5]
    with pytest.raises(TypeError):
        turns[0] = expected[1]
    assert all(set(turn) == {"input", "output", "entities"} for turn in turns)
    turns[0]["input"] = "changed"
    turns[0]["entities"].append("Omar")
    assert turns[0] == expected[0]


def test_chat_memory_iterates_every_turn_beyond_one_page(make_memory):
    memory = make_memory(FixedLLM(""))
    memory.save_contexts(({"input": f"turn {i}"}, {"output": ""}) for i in range(520))

    assert [turn["input"] for turn in memory.chat_memory] == [f"turn {i}" for i in range(520)]
    assert memory.chat_memory[-1]["input"] == "turn 519"
    assert [turn["input"] for turn in memory.chat_memory[498:502]] == [
        f"turn {i}" for i in range(498, 502)
    ]


# -- order and names ----------------------------------------------------------------------


def test_list_entities_follows_first_sight_not_alphabetical_or_insertion_id_order(make_memory):
    memory = make_memory(KeywordLLM(["Zed", "Amy", "Mia", "Bob", "Kai"]))
    say(memory, "Zed met Amy")
    say(memory, "Mia saw Amy and Bob")
    say(memory, "Kai and Zed")

    assert memory.list_entities() == ["Zed", "Amy", "Mia", "Bob", "Kai"]


def test_list_entities_keeps_first_seen_order_beyond_one_page(make_memory):
    names = [f"Name{number:04d}" for number in range(620, 0, -1)]
    llm = FixedLLM(", ".join(names[:310]))
    memory = make_memory(llm)
    say(memory, "first batch")
    llm.response = ", ".join(names[300:])
    say(memory, "second batch")

    assert memory.list_entities() == names
    assert len(memory.entity_store) == 620


def test_first_seen_order_survives_forgetting_the_last_turn(make_memory):
    memory = make_memory(KeywordLLM(["Sarah", "Omar", "Bob", "Zed"]))
    say(memory, "Sarah joined")
    say(memory, "Omar and Bob")
    memory.entity_store["Bob"].add_context("a note about Bob")
    memory.forget_entity("Omar", with_turns=True)

    say(memory, "Zed arrived")

    assert memory.get_entity_info("Bob")["recent_contexts"] == ["a note about Bob"]
    assert memory.list_entities() == ["Sarah", "Bob", "Zed"]


def test_display_name_is_the_first_form_seen(make_memory):
    memory = make_memory(KeywordLLM(["sarah", "SARAH", "Sarah"]))
    say(memory, "sarah joined")
    say(memory, "SARAH called")

    assert memory.list_entities() == ["sarah"]
    assert memory.get_entity_info("Sarah")["name"] == "sarah"
    assert memory.entity_store["SARAH"].name == "sarah"
    assert recall(memory, "Sarah?").startswith("Previous information about sarah:\n")
    assert [turn["entities"] for turn in memory.chat_memory] == [["sarah"], ["SARAH"]]


EQUIVALENT_NAMES = [
    ("Sarah", "SARAH"),
    ("Strauß", "STRAUSS"),
    ("Ｌｉｎａ", "lina"),
    ("ﬁona", "Fiona"),
    ("Acme   Corp", "acme corp"),
    ("Zed\u00a0Labs", "zed labs"),
    ("أحمد", "احمد"),
    ("سَلمى", "سلمى"),
    ("يوسـف", "يوسف"),
    ("إسلام", "اسلام"),
    ("آمنة", "امنة"),
    ("ٱلنور", "النور"),
    ("مُحَمَّد", "محمد"),
]


def test_names_equal_after_nfkc_casefold_whitespace_and_arabic_folding_are_one_entity(
    make_memory,
):
    firsts = [first for first, _ in EQUIVALENT_NAMES]
    variants = [variant for _, variant in EQUIVALENT_NAMES]
    llm = FixedLLM(", ".join(firsts))
    memory = make_memory(llm)
    say(memory, "first forms")
    llm.response = ", ".join(variants)
    say(memory, "other forms")

    assert memory.list_entities() == firsts
    for first, variant in EQUIVALENT_NAMES:
        info = memory.get_entity_info(variant)
        assert info is not None, variant
        assert info["name"] == first
        assert info["contexts_count"] == 2
        assert variant in memory.entity_store
    assert [turn["entities"] for turn in memory.chat_memory] == [firsts, variants]


def test_arabic_alef_forms_and_tashkeel_name_one_entity(make_memory):
    memory = make_memory(KeywordLLM(["أحمد", "احمد", "أَحمد"]))
    say(memory, "وصل أحمد")
    say(memory, "اتصل احمد")
    say(memory, "غادر أَحمد")

    assert memory.list_entities() == ["أحمد"]
    for form in ("أحمد", "احمد", "أَحمد", "إحمد", "آحمد", "أحـمد"):
        assert memory.get_entity_info(form)["contexts_count"] == 3
    assert recall(memory, "احمد") == (
        "Previous information about أحمد:\nوصل أحمد ok\nاتصل احمد ok\nغادر أَحمد ok"
    )


def test_without_normalization_sarah_and_lowercase_sarah_are_two_entities(make_memory):
    llm = FixedLLM("Sarah")
    memory = make_memory(llm, normalize_names=False)
    say(memory, "Sarah joined")
    llm.response = "sarah, احمد, أحمد"
    say(memory, "sarah called")

    assert memory.list_entities() == ["Sarah", "sarah", "احمد", "أحمد"]
    assert memory.get_entity_info("SARAH") is None
    assert memory.get_entity_info("Sarah")["recent_contexts"] == ["Sarah joined ok"]
    assert memory.get_entity_info("sarah")["recent_contexts"] == ["sarah called ok"]
    assert "sarah" in memory.entity_store
    assert "SARAH" not in memory.entity_store


def test_one_snippet_per_entity_per_turn(make_memory):
    memory = make_memory(FixedLLM("Sarah, Omar, sarah, SARAH, Sarah"))
    say(memory, "Sarah and Omar")

    assert memory.get_entity_info("Sarah")["contexts_count"] == 1
    assert counts(memory) == (2, 1, 2)
    assert memory.chat_memory[0]["entities"] == ["Sarah", "Omar"]


def test_one_block_per_entity_per_query(make_memory):
    llm = FixedLLM("Sarah")
    memory = make_memory(llm)
    say(memory, "Sarah joined")
    llm.response = "sarah, Sarah, SARAH"

    assert recall(memory, "Sarah, sarah?") == "Previous information about Sarah:\nSarah joined ok"


# -- recall -------------------------------------------------------------------------------


def test_default_recall_header_is_chosen_by_lang(make_memory):
    headers = {
        "en": "Previous information about Sarah:",
        "ar": "معلومات سابقة عن Sarah:",
        "fr": "Previous information about Sarah:",
    }
    for lang, header in headers.items():
        memory = make_memory(FixedLLM("Sarah"), lang=lang, session_id=lang)
        say(memory, "Sarah joined")

        assert recall(memory, "Sarah") == header + "\nSarah joined ok"
        assert memory.entity_info_template.format(name="Sarah") == header


def test_custom_entity_info_template_is_the_block_header(make_memory):
    memory = make_memory(FixedLLM("Sarah"), lang="ar", entity_info_template="About {name} —")
    say(memory, "Sarah joined")

    assert recall(memory, "Sarah") == "About Sarah —\nSarah joined ok"


def test_recall_blocks_are_header_then_contexts_and_joined_by_a_blank_line(make_memory):
    memory = make_memory(KeywordLLM(["Sarah", "Omar"]))
    say(memory, "Sarah one", "a")
    say(memory, "Omar two", "b")
    say(memory, "Sarah three", "c")
    say(memory, "Sarah four", "d")
    say(memory, "Sarah and Omar five", "e")

    assert recall(memory, "Omar or Sarah?") == (
        "Previous information about Omar:\nOmar two b\nSarah and Omar five e"
        "\n\n"
        "Previous information about Sarah:\nSarah three c\nSarah four d\nSarah and Omar five e"
    )
    assert recall(memory, "Nobody") == ""


def test_a_recall_naming_more_entities_than_one_statement_carries_gives_them_all_in_order(
    make_memory,
):
    names = [f"Client {number:02d}" for number in range(70)]  # SQLite: 32 keys a statement
    memory = make_memory(KeywordLLM(names))
    for name in names:
        say(memory, f"{name} called", "noted")
    asked = names[::-1]

    assert recall(memory, " ".join(asked)) == "\n\n".join(
        f"Previous information about {name}:\n{name} called noted" for name in asked
    )


# -- entities -----------------------------------------------------------------------------


def test_get_recent_contexts_gives_the_last_three_oldest_first_and_refuses_a_limit_below_one(
    make_memory,
):
    memory = make_memory(FixedLLM("Sarah"))
    for number in range(5):
        say(memory, f"turn {number}")
    everything = [f"turn {number} ok" for number in range(5)]
    entity = memory.entity_store["Sarah"]

    assert entity.get_recent_contexts() == everything[-3:]
    assert entity.get_recent_contexts(1) == everything[-1:]
    assert entity.get_recent_contexts(limit=10) == everything
    assert entity.get_recent_contexts(limit=None) == everything
    assert entity.contexts == everything
    assert memory.get_entity_info("Sarah")["recent_contexts"] == everything[-3:]
    assert memory.get_entity_info("Sarah")["contexts_count"] == 5
    for limit in (0, -1):
        with pytest.raises(ValueError, match="limit"):
            entity.get_recent_contexts(limit)


def test_add_context_persists_and_is_the_most_recent_snippet(make_memory):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah one")
    say(memory, "Sarah two")

    memory.entity_store["sarah"].add_context("a note about Sarah")

    reopened = make_memory(FixedLLM("Sarah"))
    assert reopened.get_entity_info("Sarah")["recent_contexts"] == [
        "Sarah one ok",
        "Sarah two ok",
        "a note about Sarah",
    ]
    assert counts(reopened) == (1, 2, 3)
    assert recall(reopened, "Sarah").endswith("\nSarah two ok\na note about Sarah")
    say(reopened, "Sarah three")
    assert reopened.entity_store["Sarah"].get_recent_contexts(2) == [
        "a note about Sarah",
        "Sarah three ok",
    ]


def test_last_seen_never_moves_backwards(make_memory):
    readings = [2000.0, 1000.0, 500.0, 900.0, 800.0, 2600.0, 2500.0, 3000.0]
    memory = make_memory(FixedLLM("Sarah"), clock=lambda: readings.pop(0))

    say(memory, "at 2000")
    say(memory, "at 1000")
    assert memory.get_entity_info("Sarah")["last_seen"] == 2000.0

    entity = memory.entity_store["Sarah"]
    entity.add_context("at 500")
    assert entity.last_seen == 2000.0
    assert memory.get_entity_info("Sarah")["last_seen"] == 2000.0

    memory.save_contexts([({"input": "at 900"}, {}), ({"input": "at 800"}, {})])
    assert memory.get_entity_info("Sarah")["last_seen"] == 2000.0
    memory.save_contexts([({"input": "at 2600"}, {}), ({"input": "at 2500"}, {})])
    assert memory.get_entity_info("Sarah")["last_seen"] == 2600.0

    say(memory, "at 3000")
    assert memory.get_entity_info("Sarah")["last_seen"] == 3000.0
    assert memory.get_entity_info("Sarah")["first_seen"] == 2000.0


def test_an_unknown_entity_type_takes_the_first_known_type(make_memory):
    extractor = ScriptedExtractor(
        [[("Sarah", "unknown")], [("sarah", "PERSON")], [("SARAH", "ORG")]]
    )
    memory = make_memory(extractor=extractor)
    say(memory, "Sarah one")
    assert memory.get_entity_info("Sarah")["type"] == "unknown"

    say(memory, "Sarah two")
    say(memory, "Sarah three")

    assert memory.get_entity_info("Sarah")["type"] == "PERSON"
    assert memory.entity_store["Sarah"].entity_type == "PERSON"


# -- stats and extraction -----------------------------------------------------------------


def test_memory_stats_have_the_originals_keys_and_the_extraction_errors(make_memory):
    memory = make_memory(KeywordLLM(["Sarah", "Omar"]))
    say(memory, "Sarah and Omar")
    say(memory, "Sarah again")

    assert memory.get_memory_stats() == {
        "type": "ConversationEntityMemory",
        "entity_count": 2,
        "message_count": 2,
        "total_contexts": 3,
        "extraction_errors": 0,
        "last_extraction_error": None,
    }


def test_extraction_failures_are_counted_never_raised_and_the_turn_is_saved(make_memory):
    memory = make_memory(BrokenLLM(RuntimeError("model timed out")))

    say(memory, "Sarah joined")

    assert list(memory.chat_memory) == [{"input": "Sarah joined", "output": "ok", "entities": []}]
    stats = memory.get_memory_stats()
    assert stats["extraction_errors"] == 1
    assert "model timed out" in stats["last_extraction_error"]
    assert memory.load_memory_variables({"input": "Sarah"}) == {"entity_info": ""}
    assert memory.get_memory_stats()["extraction_errors"] == 2

    memory.llm = FixedLLM(None)
    say(memory, "Sarah again")
    stats = memory.get_memory_stats()
    assert stats["extraction_errors"] == 3
    assert stats["last_extraction_error"] != "RuntimeError: model timed out"
    assert counts(memory) == (0, 2, 0)

    fresh = make_memory(BrokenLLM())
    assert fresh.get_memory_stats()["extraction_errors"] == 0
    assert fresh.get_memory_stats()["last_extraction_error"] is None
    assert fresh.get_memory_stats()["message_count"] == 2


def test_default_extraction_prompt_is_the_originals_verbatim(make_memory):
    assert make_memory().entity_extraction_prompt == ORIGINAL_PROMPT
    assert make_memory(lang="ar").entity_extraction_prompt == ORIGINAL_PROMPT
    llm = RecordingLLM("Sarah")
    custom = make_memory(llm, entity_extraction_prompt="Names in: {text}")
    say(custom, "Sarah joined")
    assert llm.calls == [("Names in: Sarah joined ok", 100)]


def test_llm_is_asked_with_the_formatted_prompt_and_100_tokens(make_memory):
    llm = RecordingLLM("Al, Bob, , X ,  Eve  ,Sam,Jo, ab c")
    memory = make_memory(llm)

    say(memory, "Bob met Eve", "hi")

    assert llm.calls == [(ORIGINAL_PROMPT.format(text="Bob met Eve hi"), 100)]
    assert memory.chat_memory[0]["entities"] == ["Bob", "Eve", "Sam", "ab c"]


def test_blank_text_extracts_nothing_without_calling_the_llm(make_memory):
    llm = RecordingLLM("Sarah")
    memory = make_memory(llm)

    assert memory._extract_entities("") == []
    assert memory._extract_entities("  \n\t ") == []
    memory.save_context({"input": ""}, {"output": "  "})
    memory.save_context({}, {})
    assert memory.load_memory_variables({"input": " "}) == {"entity_info": ""}
    assert memory.load_memory_variables({}) == {"entity_info": ""}

    assert llm.calls == []
    assert [turn["entities"] for turn in memory.chat_memory] == [[], []]


def test_names_too_long_or_holding_control_characters_are_skipped(make_memory):
    longest, too_long = "ب" * 256, "ت" * 257
    names = [longest, too_long, "Bad\x07Bell", "Tab\tName", "Nul\x00Name", "Line\nBreak", "Good"]
    memory = make_memory(FixedLLM(", ".join(names)))

    say(memory, "many names")

    assert memory.list_entities() == [longest, "Good"]
    assert memory.chat_memory[0]["entities"] == [longest, "Good"]
    assert memory.get_entity_info(longest)["name"] == longest
    assert counts(memory) == (2, 1, 2)


def test_a_name_that_cannot_be_encoded_is_skipped_and_the_turn_is_saved(make_memory):
    memory = make_memory(FixedLLM("Sa\ud800rah, Good"))

    say(memory, "Sarah joined")

    assert memory.list_entities() == ["Good"]
    assert list(memory.chat_memory) == [
        {"input": "Sarah joined", "output": "ok", "entities": ["Good"]}
    ]


# -- bulk import --------------------------------------------------------------------------

BULK_TURNS = [
    ({"input": "Zed met Amy"}, {"output": "noted"}),
    ({"input": "amy called"}, {"output": "about Bob"}),
    ({"input": "nothing here"}, {"output": ""}),
    ({"input": "أحمد و احمد"}, {"output": "Zed"}),
    ({"input": ""}, {"output": ""}),
    ({"input": "Bob, Amy and Zed"}, {"output": "all three"}),
    ({"input": "Amy"}, {"output": "again"}),
]
BULK_VOCABULARY = ["Zed", "Amy", "amy", "Bob", "أحمد", "احمد"]


def state_of(memory):
    details = {}
    for name in [*memory.list_entities(), "AMY", "احمد"]:
        info = memory.get_entity_info(name)
        details[name] = {k: v for k, v in info.items() if k not in ("first_seen", "last_seen")}
    return {
        "chat_memory": list(memory.chat_memory),
        "entities": memory.list_entities(),
        "details": details,
        "stats": memory.get_memory_stats(),
        "recall": [recall(memory, q) for q in ("Amy and Zed", "Bob", "احمد")],
    }


def test_save_contexts_gives_the_same_state_as_a_save_context_loop(make_memory):
    looped = make_memory(KeywordLLM(BULK_VOCABULARY), session_id="looped")
    bulk = make_memory(KeywordLLM(BULK_VOCABULARY), session_id="bulk")
    for inputs, outputs in BULK_TURNS:
        looped.save_context(inputs, outputs)

    assert bulk.save_contexts(iter(BULK_TURNS)) == len(BULK_TURNS)

    assert state_of(bulk) == state_of(looped)
    assert state_of(bulk)["entities"] == ["Zed", "Amy", "Bob", "أحمد"]


def test_save_contexts_adds_to_what_is_already_there(make_memory):
    looped = make_memory(KeywordLLM(BULK_VOCABULARY), session_id="looped")
    bulk = make_memory(KeywordLLM(BULK_VOCABULARY), session_id="bulk")
    for inputs, outputs in BULK_TURNS:
        looped.save_context(inputs, outputs)
    for inputs, outputs in BULK_TURNS[:2]:
        bulk.save_context(inputs, outputs)

    bulk.save_contexts(BULK_TURNS[2:])

    assert state_of(bulk) == state_of(looped)


def test_save_contexts_writes_nothing_when_one_pair_is_refused(make_memory):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah before")

    with pytest.raises(TypeError, match="'output'"):
        memory.save_contexts(
            [({"input": "Sarah a"}, {"output": "b"}), ({"input": "Sarah c"}, {"output": 3})]
        )

    assert counts(memory) == (1, 1, 1)
    assert [turn["input"] for turn in memory.chat_memory] == ["Sarah before"]
    assert memory.save_contexts([]) == 0
    assert counts(memory) == (1, 1, 1)


# -- forget_entity ------------------------------------------------------------------------


def forget_setup(make_memory, **options):
    memory = make_memory(KeywordLLM(["Sarah", "SARAH", "Acme Corp", "Bob"]), **options)
    say(memory, "Sarah joined Acme Corp")
    say(memory, "Bob called")
    say(memory, "SARAH renewed")
    memory.entity_store["Sarah"].add_context("a note")
    return memory


def test_forget_entity_erases_it_and_its_name_from_the_turns(make_memory):
    memory = forget_setup(make_memory)

    receipt = memory.forget_entity("sarah")

    assert receipt == {
        "entity": "Sarah",
        "entities": 1,
        "contexts": 3,
        "turns_deleted": 0,
        "turns_updated": 2,
    }
    assert list(memory.chat_memory) == [
        {"input": "Sarah joined Acme Corp", "output": "ok", "entities": ["Acme Corp"]},
        {"input": "Bob called", "output": "ok", "entities": ["Bob"]},
        {"input": "SARAH renewed", "output": "ok", "entities": []},
    ]
    assert memory.get_entity_info("Sarah") is None
    assert "SARAH" not in memory.entity_store
    assert memory.list_entities() == ["Acme Corp", "Bob"]
    assert memory.get_entity_info("Acme Corp")["recent_contexts"] == ["Sarah joined Acme Corp ok"]
    assert memory.get_entity_info("Bob")["recent_contexts"] == ["Bob called ok"]
    assert counts(memory) == (2, 3, 2)
    assert recall(memory, "Sarah") == ""


def test_forget_entity_with_turns_deletes_the_turns_that_mention_it(make_memory):
    memory = forget_setup(make_memory)
    other = forget_setup(make_memory, session_id="other")

    receipt = memory.forget_entity("Sarah", with_turns=True)

    # Acme Corp was known only from a deleted turn: it goes too.
    assert receipt == {
        "entity": "Sarah",
        "entities": 2,
        "contexts": 4,
        "turns_deleted": 2,
        "turns_updated": 0,
    }
    assert list(memory.chat_memory) == [
        {"input": "Bob called", "output": "ok", "entities": ["Bob"]}
    ]
    assert memory.get_entity_info("Sarah") is None
    assert memory.list_entities() == ["Bob"]
    assert memory.get_entity_info("Bob")["recent_contexts"] == ["Bob called ok"]
    stats = memory.get_memory_stats()
    assert (stats["message_count"], stats["total_contexts"]) == (1, 1)
    assert counts(other) == (3, 3, 5)


def test_forget_entity_without_normalization_keeps_other_spellings(make_memory):
    memory = make_memory(FixedLLM("Sarah, sarah"), normalize_names=False)
    say(memory, "Sarah and sarah")

    receipt = memory.forget_entity("Sarah")

    assert (receipt["entities"], receipt["contexts"]) == (1, 1)
    assert memory.chat_memory[0]["entities"] == ["sarah"]
    assert memory.list_entities() == ["sarah"]


def test_forgetting_an_unknown_name_deletes_nothing(make_memory):
    memory = forget_setup(make_memory)
    before = list(memory.chat_memory)

    receipt = memory.forget_entity("Nobody")

    assert receipt["entities"] == 0
    assert (receipt["contexts"], receipt["turns_deleted"], receipt["turns_updated"]) == (0, 0, 0)
    assert counts(memory) == (3, 3, 5)
    assert list(memory.chat_memory) == before


def test_a_forgotten_entity_seen_again_is_new_and_last_in_order(make_memory):
    memory = make_memory(KeywordLLM(["Sarah", "Bob"]))
    say(memory, "Sarah and Bob")
    memory.forget_entity("Sarah")

    say(memory, "Sarah is back")

    assert memory.list_entities() == ["Bob", "Sarah"]
    assert memory.get_entity_info("Sarah")["recent_contexts"] == ["Sarah is back ok"]


# -- idempotency --------------------------------------------------------------------------


def test_a_repeated_idempotency_key_is_a_no_op_that_does_not_call_the_llm(make_memory):
    llm = RecordingLLM("Sarah")
    memory = make_memory(llm)
    memory.save_context({"input": "Sarah joined"}, {"output": "ok"}, idempotency_key="msg-1")

    memory.save_context({"input": "Sarah retried"}, {"output": "ok"}, idempotency_key="msg-1")
    asyncio.run(
        memory.asave_context({"input": "Sarah async"}, {"output": "ok"}, idempotency_key="msg-1")
    )
    make_memory(llm).save_context({"input": "Sarah other"}, {}, idempotency_key="msg-1")

    assert len(llm.calls) == 1
    assert list(memory.chat_memory) == [
        {"input": "Sarah joined", "output": "ok", "entities": ["Sarah"]}
    ]
    assert counts(memory) == (1, 1, 1)
    memory.save_context({"input": "Sarah again"}, {"output": "ok"}, idempotency_key="msg-2")
    say(memory, "Sarah without key")
    say(memory, "Sarah without key")
    assert counts(memory) == (1, 4, 4)


def test_the_same_idempotency_key_in_another_session_is_independent(make_memory):
    first = make_memory(FixedLLM("Sarah"), session_id="first")
    second = make_memory(FixedLLM("Sarah"), session_id="second")

    first.save_context({"input": "Sarah one"}, {"output": "ok"}, idempotency_key="msg-1")
    second.save_context({"input": "Sarah two"}, {"output": "ok"}, idempotency_key="msg-1")

    assert [turn["input"] for turn in first.chat_memory] == ["Sarah one"]
    assert [turn["input"] for turn in second.chat_memory] == ["Sarah two"]


# -- bad input ----------------------------------------------------------------------------


def test_inputs_or_outputs_that_are_not_mappings_are_a_type_error_naming_the_argument(
    make_memory,
):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah before")
    refused = [
        ("Sarah joined", {"output": "ok"}, "inputs"),
        (None, {"output": "ok"}, "inputs"),
        ({"input": "Sarah"}, ["ok"], "outputs"),
    ]

    for inputs, outputs, argument in refused:
        with pytest.raises(TypeError, match=argument):
            memory.save_context(inputs, outputs)
        with pytest.raises(TypeError, match=argument):
            memory.save_context(inputs, outputs, idempotency_key="key")
    with pytest.raises(TypeError, match="inputs"):
        memory.load_memory_variables("Sarah")

    assert counts(memory) == (1, 1, 1)
    memory.save_context({"input": "Sarah keyed"}, {"output": "ok"}, idempotency_key="key")
    assert counts(memory) == (1, 2, 2)


def test_values_that_are_not_text_are_a_type_error_naming_the_key(make_memory):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah before")
    refused = [
        ({"input": 5}, {"output": "ok"}, "'input'"),
        ({"input": ["Sarah"]}, {"output": "ok"}, "'input'"),
        ({"input": "Sarah"}, {"output": b"ok"}, "'output'"),
    ]

    for inputs, outputs, key in refused:
        with pytest.raises(TypeError, match=key):
            memory.save_context(inputs, outputs)
    with pytest.raises(TypeError, match="'input'"):
        memory.load_memory_variables({"input": 5})
    memory.input_key = "question"
    with pytest.raises(TypeError, match="'question'"):
        memory.save_context({"question": 7}, {"output": "ok"})

    assert counts(memory) == (1, 1, 1)


def test_a_missing_or_none_value_is_empty_text(make_memory):
    memory = make_memory(FixedLLM("Sarah"))

    memory.save_context({"input": None}, {})
    memory.save_context({}, {"output": None})
    memory.save_context({"input": "Sarah"}, {"output": None})

    assert list(memory.chat_memory) == [
        {"input": "", "output": "", "entities": []},
        {"input": "", "output": "", "entities": []},
        {"input": "Sarah", "output": "", "entities": ["Sarah"]},
    ]
    assert memory.get_entity_info("Sarah")["recent_contexts"] == ["Sarah "]


def test_a_nul_character_is_a_value_error_and_nothing_is_written(make_memory):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah before")
    entity = memory.entity_store["Sarah"]

    with pytest.raises(ValueError):
        memory.save_context({"input": "Sa\x00rah"}, {"output": "ok"})
    with pytest.raises(ValueError):
        memory.save_context({"input": "Sarah"}, {"output": "o\x00k"})
    with pytest.raises(ValueError):
        memory.save_contexts([({"input": "Sarah"}, {}), ({"input": "\x00"}, {})])
    with pytest.raises(ValueError):
        entity.add_context("a note\x00")
    with pytest.raises(ValueError):
        memory.load_memory_variables({"input": "Sarah\x00"})
    with pytest.raises(ValueError):
        memory.forget_entity("Sarah\x00")

    assert counts(memory) == (1, 1, 1)
    assert memory.get_entity_info("Sarah")["recent_contexts"] == ["Sarah before ok"]


def test_a_name_holding_nul_is_not_in_entity_store_on_any_backend(make_memory):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah joined")

    assert "Sa\x00rah" not in memory.entity_store
    assert memory.entity_store.get("Sa\x00rah") is None


def test_get_entity_info_of_a_name_holding_nul_is_a_value_error_on_every_backend(make_memory):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah joined")

    with pytest.raises(ValueError):
        memory.get_entity_info("Sa\x00rah")


def test_session_id_must_be_1_to_255_characters(database_url):
    for refused in ("", "s" * 256):
        with pytest.raises(ValueError, match="session_id"):
            ConversationEntityMemory(database_url=database_url, session_id=refused)

    for accepted in ("s" * 255, "س" * 255):
        with ConversationEntityMemory(
            FixedLLM("Sarah"), database_url=database_url, session_id=accepted
        ) as memory:
            say(memory, "Sarah joined")
            assert memory.list_entities() == ["Sarah"]


# -- the database -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:s3cret@127.0.0.1:1/x",
        "postgres://user:s3cret@127.0.0.1:1/x",
        "postgresql+psycopg://user:s3cret@127.0.0.1:1/x",
    ],
)
def test_an_unreachable_server_fails_within_seconds_without_showing_the_password(url, caplog):
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()

    with pytest.raises(DatabaseUnavailableError) as caught:
        ConversationEntityMemory(database_url=url)

    assert time.monotonic() - started < 10
    error = caught.value
    assert "127.0.0.1" in str(error)
    assert "s3cret" not in str(error)
    assert "s3cret" not in repr(error)
    assert "s3cret" not in "".join(traceback.format_exception(error))
    assert "s3cret" not in caplog.text


def test_an_unopenable_sqlite_file_fails_with_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'missing-folder' / 'memory.db'}"

    with pytest.raises(DatabaseUnavailableError, match="missing-folder"):
        ConversationEntityMemory(database_url=url)


@pytest.mark.parametrize(
    "empty_database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_an_unmigrated_postgres_database_is_refused_with_the_upgrade_command(empty_database_url):
    with pytest.raises(SchemaNotCurrentError) as refused:
        ConversationEntityMemory(database_url=empty_database_url)

    shown = sa.make_url(empty_database_url).set(drivername="postgresql+psycopg")
    command = f"zerda-store --database-url {shown.render_as_string()} db upgrade"
    if "prepared_statements=false" in empty_database_url:  # behind a transaction pooler
        command = "zerda-store --database-url SERVER_URL db upgrade"
    assert f"`{command}`" in str(refused.value)
    assert "auto_migrate=True" in str(refused.value)

    engine = sa.create_engine(direct_url(empty_database_url))
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "empty_database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_auto_migrate_upgrades_a_postgres_database_when_asked(empty_database_url):
    with ConversationEntityMemory(
        FixedLLM("Sarah"), database_url=empty_database_url, auto_migrate=True
    ) as memory:
        say(memory, "Sarah joined")
        assert memory.list_entities() == ["Sarah"]
    with Store(empty_database_url) as store:
        assert migrate.current_revision(store) == migrate.head_revision()


def test_sqlite_migrates_itself_on_first_use(sqlite_url):
    with ConversationEntityMemory(FixedLLM("Sarah"), database_url=sqlite_url) as memory:
        say(memory, "Sarah joined")
        assert memory.list_entities() == ["Sarah"]

    engine = sa.create_engine(sqlite_url)
    try:
        inspector = sa.inspect(engine)
        assert {"turns", "entities", "contexts"} <= set(inspector.get_table_names())
        assert "entity_overview" in inspector.get_view_names()
    finally:
        engine.dispose()
    with Store(sqlite_url) as store:
        assert migrate.current_revision(store) == migrate.head_revision()


def test_sqlite_with_auto_migrate_off_is_refused_with_the_upgrade_command(sqlite_url):
    with pytest.raises(SchemaNotCurrentError) as refused:
        ConversationEntityMemory(database_url=sqlite_url, auto_migrate=False)

    assert f"`zerda-store --database-url {sqlite_url} db upgrade`" in str(refused.value)


@pytest.mark.parametrize(
    "empty_database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_auto_migrate_creates_the_schema_on_an_empty_postgres_database(empty_database_url):
    with ConversationEntityMemory(
        KeywordLLM(["Sarah"]), database_url=empty_database_url, auto_migrate=True
    ) as memory:
        memory.save_context({"input": "Sarah called."}, {"output": "Noted."})

    with ConversationEntityMemory(database_url=empty_database_url) as again:
        assert again.list_entities() == ["Sarah"]


def test_forgetting_with_turns_removes_entities_known_only_from_those_turns(make_memory):
    memory = make_memory(KeywordLLM(["Sarah", "Omar", "Bob"]))
    say(memory, "Sarah joined")
    say(memory, "Omar met Bob")
    say(memory, "Sarah again")

    receipt = memory.forget_entity("Omar", with_turns=True)

    assert receipt == {
        "entity": "Omar",
        "entities": 2,
        "contexts": 2,
        "turns_deleted": 1,
        "turns_updated": 0,
    }
    assert memory.list_entities() == ["Sarah"]
    assert memory.get_entity_info("Sarah")["contexts_count"] == 2


def test_a_turn_keeps_the_first_spelling_and_the_first_known_type(make_memory):
    class Typed:
        name = "typed"

        def extract(self, text):
            return [("omar", "unknown"), ("Alice", "PERSON"), ("OMAR", "ORG"), ("alice ", "GPE")]

    memory = make_memory(extractor=Typed())
    say(memory, "omar and Alice")

    assert memory.list_entities() == ["omar", "Alice"]
    assert memory.chat_memory[0]["entities"] == ["omar", "Alice"]
    assert memory.get_entity_info("Omar")["type"] == "ORG"
    assert memory.get_entity_info("alice")["type"] == "PERSON"


def test_a_large_save_contexts_gives_the_same_state_as_a_save_context_loop(make_memory):
    """Enough rows for several statements a table on SQLite and for the arrays form on
    Postgres (more than 8 rows), with names coming back across the batch."""
    names = [f"Client {n:02d}" for n in range(40)]
    pairs = [
        (
            {"input": f"{names[i % 40]} met {names[(i * 7 + 3) % 40]}"},
            {"output": f"{names[(i * 13 + 5) % 40]} follows up, #{i}"},
        )
        for i in range(150)
    ]
    looped = make_memory(KeywordLLM(names), session_id="looped")
    bulk = make_memory(KeywordLLM(names), session_id="bulk")
    for inputs, outputs in pairs:
        looped.save_context(inputs, outputs)

    assert bulk.save_contexts(pairs) == 150

    def state(memory):
        return {
            "chat_memory": list(memory.chat_memory),
            "entities": memory.list_entities(),
            "details": [
                {k: v for k, v in memory.get_entity_info(name).items() if "seen" not in k}
                for name in names
            ],
            "stats": memory.get_memory_stats(),
            "recall": [
                recall(memory, f"{a} and {b}") for a, b in zip(names[:-5], names[5:], strict=True)
            ],
        }

    assert state(bulk) == state(looped)
    assert len(state(bulk)["entities"]) == 40
