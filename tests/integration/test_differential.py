"""The same scripted conversations through the original in-memory class and through
zerda_store give the same public state, apart from the documented differences."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from zerda.memory import ConversationEntityMemory as Original

from tests.doubles import CanonicalLLM, FixedLLM
from tests.integration.oracle import (
    CONVERSATIONS,
    ENGLISH,
    SESSIONS,
    Conversation,
    open_store,
    play,
    run_original,
    snapshot,
    with_english_headers,
    without_times,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

EXACT_SESSIONS = ("english-en", "english-ar", "arabic-ar")


def expected_state(conversation: Conversation, lang: str) -> dict:
    state = without_times(run_original(conversation))
    return state if lang == "ar" else with_english_headers(state)


def states_in_new_process(database_url: str, session_ids) -> dict:
    completed = subprocess.run(
        [sys.executable, "-m", "tests.integration.oracle", database_url, *session_ids],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_conversations_give_the_originals_state_also_when_a_new_process_reopens_them(
    database_url,
):
    before = {}
    for session_id, (name, _, _) in SESSIONS.items():
        conversation = CONVERSATIONS[name]
        with open_store(database_url, session_id) as memory:
            play(memory, conversation)
            before[session_id] = snapshot(memory, conversation)

    after = states_in_new_process(database_url, list(SESSIONS))

    for session_id in EXACT_SESSIONS:
        name, lang, _ = SESSIONS[session_id]
        expected = expected_state(CONVERSATIONS[name], lang)
        assert without_times(before[session_id]) == expected, session_id
        assert without_times(after[session_id]) == expected, session_id
    assert after == json.loads(json.dumps(before))
    for state in before.values():
        for info in filter(None, state["info"].values()):
            assert isinstance(info["first_seen"], float)
            assert info["first_seen"] <= info["last_seen"]
    assert before["arabic-normalized"]["info"]["احمد"]["name"] == "أحمد"


def test_async_methods_give_the_originals_state(make_memory):
    conversation = ENGLISH
    memory = make_memory(conversation.llm(), normalize_names=False)
    original = Original(llm=conversation.llm())

    async def run(target):
        for inputs, outputs in conversation.turns:
            await target.asave_context(inputs, outputs)
        return [await target.aload_memory_variables({"input": q}) for q in conversation.queries]

    ours, theirs = asyncio.run(run(memory)), asyncio.run(run(original))

    assert [v["entity_info"] for v in ours] == [
        v["entity_info"].replace("معلومات سابقة عن ", "Previous information about ") for v in theirs
    ]
    assert list(memory.chat_memory) == original.chat_memory


def test_extract_entities_gives_the_originals_names(make_memory):
    response = "Sarah, , Al,  Acme Corp ,x,Bob the builder, Sarah,زيد,علي"
    memory = make_memory(FixedLLM(response))
    original = Original(llm=FixedLLM(response))

    for text in ("Sarah met Bob", "سارة"):
        assert memory._extract_entities(text) == original._extract_entities(text)


# Normalized names: the original fed with one canonical form per entity is the oracle.

NORMALIZED = Conversation(
    vocabulary=(
        "Sarah",
        "sarah",
        "SARAH",
        "Ｓａｒａｈ",
        "Strauß",
        "STRAUSS",
        "Acme Corp",
        "acme   corp",
        "أحمد",
        "احمد",
        "أَحمد",
        "أحـــمد",
        "إحمد",
    ),
    turns=(
        ({"input": "Sarah met Strauß at Acme Corp."}, {"output": "noted"}),
        ({"input": "sarah called again"}, {"output": "acme   corp renewed"}),
        ({"input": "أحمد وصل"}, {"output": "مرحبا احمد"}),
        ({"input": "STRAUSS and SARAH"}, {"output": "ok"}),
        ({"input": "Ｓａｒａｈ wrote"}, {"output": "أَحمد replied"}),
        ({"input": "أحـــمد و إحمد"}, {"output": "Sarah"}),
    ),
    queries=(
        "what about sarah",
        "SARAH and acme   corp",
        "احمد",
        "أَحمد and STRAUSS",
        "nothing",
    ),
    lookups=("Sarah", "sarah", "SARAH", "Ｓａｒａｈ", "strauss", "ACME CORP", "احمد", "أحمد"),
)

CANONICAL = {
    "sarah": "Sarah",
    "SARAH": "Sarah",
    "Ｓａｒａｈ": "Sarah",
    "STRAUSS": "Strauß",
    "acme   corp": "Acme Corp",
    "احمد": "أحمد",
    "أَحمد": "أحمد",
    "أحـــمد": "أحمد",
    "إحمد": "أحمد",
}


def test_normalized_names_give_the_state_of_the_original_fed_one_form_per_entity(make_memory):
    memory = make_memory(NORMALIZED.llm())
    play(memory, NORMALIZED)
    ours = without_times(snapshot(memory, NORMALIZED))

    original = Original(llm=CanonicalLLM(NORMALIZED.llm(), CANONICAL))
    play(original, NORMALIZED)
    lookups = {n: original.get_entity_info(CANONICAL.get(n, n)) for n in NORMALIZED.lookups}
    lookups["strauss"] = original.get_entity_info("Strauß")
    lookups["ACME CORP"] = original.get_entity_info("Acme Corp")
    expected = with_english_headers(
        without_times({**snapshot(original, NORMALIZED), "info": lookups})
    )

    assert ours["entities"] == expected["entities"] == ["Sarah", "Strauß", "Acme Corp", "أحمد"]
    assert ours["info"] == expected["info"]
    assert ours["stats"] == expected["stats"]
    assert ours["recall"] == expected["recall"]
    assert [t["entities"] for t in ours["chat_memory"]] == [
        ["Sarah", "Strauß", "Acme Corp"],
        ["sarah", "acme   corp"],
        ["أحمد"],
        ["STRAUSS", "SARAH"],
        ["Ｓａｒａｈ", "أَحمد"],
        ["أحـــمد", "Sarah"],
    ]
    assert [(t["input"], t["output"]) for t in ours["chat_memory"]] == [
        (t["input"], t["output"]) for t in original.chat_memory
    ]


# Names repeated in one turn or one query.


def test_a_name_repeated_in_one_turn_gets_one_snippet_where_the_original_gets_two(make_memory):
    memory = make_memory(FixedLLM("Sarah, Acme Corp, Sarah"), normalize_names=False)
    original = Original(llm=FixedLLM("Sarah, Acme Corp, Sarah"))
    for target in (memory, original):
        target.save_context({"input": "Sarah and Sarah"}, {"output": "ok"})

    assert original.get_entity_info("Sarah")["contexts_count"] == 2
    assert memory.get_entity_info("Sarah")["contexts_count"] == 1
    assert original.chat_memory[0]["entities"] == ["Sarah", "Acme Corp", "Sarah"]
    assert memory.chat_memory[0]["entities"] == ["Sarah", "Acme Corp"]
    assert memory.get_memory_stats()["total_contexts"] == 2
    assert original.get_memory_stats()["total_contexts"] == 3


def test_a_name_repeated_in_one_query_gets_one_block_where_the_original_gets_two(make_memory):
    memory = make_memory(FixedLLM("Sarah"), lang="ar", normalize_names=False)
    original = Original(llm=FixedLLM("Sarah"))
    for target in (memory, original):
        target.save_context({"input": "Sarah joined"}, {"output": "ok"})
        target.llm = FixedLLM("Sarah, Sarah")

    ours = memory.load_memory_variables({"input": "Sarah? Sarah!"})["entity_info"]
    theirs = original.load_memory_variables({"input": "Sarah? Sarah!"})["entity_info"]

    assert theirs == ours + "\n\n" + ours
    assert ours == "معلومات سابقة عن Sarah:\nSarah joined ok"


def test_lang_chooses_the_recall_header_where_the_original_always_writes_arabic(make_memory):
    memory = make_memory(FixedLLM("Sarah"), lang="en")
    original = Original(llm=FixedLLM("Sarah"), lang="en")
    for target in (memory, original):
        target.save_context({"input": "Sarah joined"}, {"output": "ok"})

    assert original.load_memory_variables({"input": "Sarah"})["entity_info"] == (
        "معلومات سابقة عن Sarah:\nSarah joined ok"
    )
    assert memory.load_memory_variables({"input": "Sarah"})["entity_info"] == (
        "Previous information about Sarah:\nSarah joined ok"
    )
