"""The inspection views (entity_overview, entity_snippets): their columns and values,
and what a repaired older turn or an added note does to them."""

from __future__ import annotations

from typing import Any

from tests.doubles import FixedLLM, KeywordLLM, TypedExtractor, query, say

OVERVIEW_COLUMNS = [
    "session_id",
    "name",
    "entity_type",
    "contexts_count",
    "first_seen",
    "last_seen",
    "last_context",
]


def overview(database_url: str, session_id: str = "default"):
    return query(
        database_url,
        "SELECT * FROM entity_overview WHERE session_id = :s ORDER BY name",
        s=session_id,
    )


def snippets(database_url: str, session_id: str = "default") -> list[tuple[Any, ...]]:
    return query(
        database_url,
        "SELECT name, recency, text FROM entity_snippets WHERE session_id = :s"
        " ORDER BY name, recency",
        s=session_id,
    )[1]


def test_entity_overview_has_exactly_its_columns_and_the_right_values(
    make_memory, database_url, clock
):
    extractor = TypedExtractor({"Sarah": "PERSON", "Acme Corp": "ORG"})
    memory = make_memory(extractor=extractor, clock=clock)
    other = make_memory(extractor=extractor, session_id="other", clock=clock)
    say(memory, "Sarah joined Acme Corp", "first")  # at 1000
    say(memory, "Sarah called", "second")  # at 1100
    say(other, "Acme Corp elsewhere")  # at 1200

    columns, rows = overview(database_url)

    assert columns == OVERVIEW_COLUMNS
    assert rows == [
        ("default", "Acme Corp", "ORG", 1, 1000.0, 1000.0, "Sarah joined Acme Corp first"),
        ("default", "Sarah", "PERSON", 2, 1000.0, 1100.0, "Sarah called second"),
    ]
    assert overview(database_url, "other")[1] == [
        ("other", "Acme Corp", "ORG", 1, 1200.0, 1200.0, "Acme Corp elsewhere ok"),
    ]


def test_entity_overview_last_context_is_a_note_added_to_the_entity(
    make_memory, database_url, clock
):
    memory = make_memory(FixedLLM("Sarah"), clock=clock)
    say(memory, "Sarah one")  # at 1000
    say(memory, "Sarah two")  # at 1100

    memory.entity_store["Sarah"].add_context("a note about Sarah")  # at 1200

    assert overview(database_url)[1] == [
        ("default", "Sarah", "unknown", 3, 1000.0, 1200.0, "a note about Sarah"),
    ]
    assert snippets(database_url) == [
        ("Sarah", 1, "a note about Sarah"),
        ("Sarah", 2, "Sarah two ok"),
        ("Sarah", 3, "Sarah one ok"),
    ]


def test_entity_overview_keeps_the_latest_snippet_after_an_older_turn_is_repaired(
    make_memory, database_url, clock
):
    extractor = TypedExtractor({"Sarah": "PERSON", "Omar": "PERSON"})
    memory = make_memory(extractor=extractor, clock=clock)
    extractor.down = True
    say(memory, "Sarah and Omar met", "old")  # at 1000, extraction fails
    extractor.down = False
    say(memory, "Sarah called", "new")  # at 1100

    assert memory.reextract() == {"repaired": 1, "failed": 0}

    assert overview(database_url)[1] == [
        ("default", "Omar", "PERSON", 1, 1000.0, 1000.0, "Sarah and Omar met old"),
        ("default", "Sarah", "PERSON", 2, 1000.0, 1100.0, "Sarah called new"),
    ]
    assert snippets(database_url) == [
        ("Omar", 1, "Sarah and Omar met old"),
        ("Sarah", 1, "Sarah called new"),
        ("Sarah", 2, "Sarah and Omar met old"),
    ]


def test_entity_snippets_ranks_each_entitys_snippets_newest_first_from_one(
    make_memory, database_url
):
    memory = make_memory(KeywordLLM(["Sarah", "Omar"]))
    other = make_memory(KeywordLLM(["Sarah"]), session_id="other")
    say(memory, "Sarah one")
    say(other, "Sarah elsewhere")
    say(memory, "Omar one")
    say(memory, "Sarah and Omar")
    say(memory, "Sarah three")

    assert snippets(database_url) == [
        ("Omar", 1, "Sarah and Omar ok"),
        ("Omar", 2, "Omar one ok"),
        ("Sarah", 1, "Sarah three ok"),
        ("Sarah", 2, "Sarah and Omar ok"),
        ("Sarah", 3, "Sarah one ok"),
    ]
    assert snippets(database_url, "other") == [("Sarah", 1, "Sarah elsewhere ok")]


def test_the_views_show_everything_stored_until_a_prune_makes_them_agree_with_the_reads(
    make_memory, database_url
):
    """As docs/operations.md says: the views show everything stored, what retention
    hides from the reads too, until `prune` deletes it; then they agree."""
    memory = make_memory(FixedLLM("Sarah"), session_id="kept")
    for n in range(3):
        memory.save_context({"input": f"Sarah, note {n}"}, {"output": "ok"})
    memory.set_retention(keep_last=1)

    assert memory.get_entity_info("Sarah")["contexts_count"] == 1
    assert [row[1] for row in snippets(database_url, "kept")] == [1, 2, 3]
    assert overview(database_url, "kept")[1][0][3] == 3

    memory.prune()

    assert [row[1] for row in snippets(database_url, "kept")] == [1]
    assert overview(database_url, "kept")[1][0][3] == 1
    assert memory.get_entity_info("Sarah")["contexts_count"] == 1
