"""Revision 0006 on a database the released version (0004) filled, on both backends: a
session is re-keyed only when what it recorded proves fold-v1 keys, and every merge the
upgrade makes can be undone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import invoke, succeeded
from tests.doubles import FixedLLM
from tests.migrations.released import released_database, rows, save_turns
from zerda_store import ConversationEntityMemory, KeyRulesMismatchError, Store, migrate

SESSION_RULES = "SELECT key_rules FROM session_key_rules WHERE session_id = :session"
KEYS = "SELECT name, name_key FROM entities WHERE session_id = :session ORDER BY id"


@pytest.fixture
def store(empty_database_url: str) -> Iterator[Store]:
    with Store(empty_database_url) as store:
        released_database(store)
        yield store


@pytest.mark.parametrize(
    "names", [("muller", "müller"), ("فاطمة", "فاطمه")], ids=["lower-case-latin", "arabic"]
)
def test_an_exact_session_that_looks_normalised_keeps_its_entities_apart(
    store: Store, names: tuple[str, str]
) -> None:
    save_turns(store, "exact", [[names[0]], [names[1]]], exact=True)

    report = migrate.upgrade(store)

    assert rows(store, KEYS, session="exact") == [(name, name) for name in names]
    assert rows(store, SESSION_RULES, session="exact") == [("exact",)]
    assert rows(store, "SELECT COUNT(*) FROM entity_merges") == [(0,)]
    assert [(entry["session_id"], entry["unsure"]) for entry in report] == [("exact", True)]
    llm = FixedLLM(names[1])
    with ConversationEntityMemory(
        store=store, session_id="exact", normalize_names=False, llm=llm
    ) as memory:
        memory.save_context({"input": names[1]}, {"output": "ok"})
        assert memory.list_entities() == list(names)


def test_an_unsure_session_is_rekeyed_when_the_operator_says_it_was_normalised(
    store: Store,
) -> None:
    save_turns(store, "s", [["muller"], ["müller"]])
    save_turns(store, "other", [["muller"], ["müller"]], exact=True)

    report = migrate.upgrade(store, assume_normalized={"s"})

    assert rows(store, KEYS, session="s") == [("muller", "muller")]
    assert rows(store, SESSION_RULES, session="s") == [("fold-v2",)]
    assert report[1]["merges"] == [
        {"merge_id": 1, "kept": "muller", "merged": "müller", "undone": False}
    ]
    assert rows(store, KEYS, session="other") == [("muller", "muller"), ("müller", "müller")]
    assert rows(store, SESSION_RULES, session="other") == [("exact",)]


def test_a_turn_naming_a_form_no_entity_is_keyed_by_proves_fold_v1(store: Store) -> None:
    save_turns(store, "s", [["muller"], ["MULLER"], ["müller"]])

    migrate.upgrade(store)

    assert rows(store, KEYS, session="s") == [("muller", "muller")]
    assert rows(store, SESSION_RULES, session="s") == [("fold-v2",)]


def test_a_session_whose_keys_no_rule_changes_is_left_for_its_next_save_to_record(
    store: Store,
) -> None:
    save_turns(store, "plain", [["sarah", "acme"]])

    migrate.upgrade(store)

    assert rows(store, SESSION_RULES, session="plain") == []
    with ConversationEntityMemory(
        store=store, session_id="plain", normalize_names=False, llm=FixedLLM("sarah")
    ) as memory:
        memory.save_context({"input": "sarah"}, {"output": "ok"})
        assert memory.list_entities() == ["sarah", "acme"]
    with (
        ConversationEntityMemory(store=store, session_id="plain", llm=FixedLLM("x")) as memory,
        pytest.raises(KeyRulesMismatchError, match="keyed with the 'exact' key rules"),
    ):
        memory.save_context({"input": "x"}, {"output": "ok"})


# The pairs whose merge could not be undone: the merged entity's old key is the kept
# entity's new one. "Sarah" makes each session provably fold-v1.
PAIRS = [
    ("Müller", "Muller"),
    ("Jean-Luc Picard", "Jean Luc Picard"),
    ("J.P. Morgan", "JP Morgan"),
    ("Zoë", "Zoe"),
    ("Acme Corp.", "Acme Corp"),
    ("فاطمة", "فاطمه"),
    ("عبد الله", "عبدالله"),
]


@pytest.mark.parametrize(("kept", "merged"), PAIRS, ids=[pair[1] for pair in PAIRS])
def test_every_merge_of_the_upgrade_can_be_undone(store: Store, kept: str, merged: str) -> None:
    save_turns(store, "s", [["Sarah", kept], [merged]])
    report = migrate.upgrade(store)
    assert report[0]["merges"] == [{"merge_id": 1, "kept": kept, "merged": merged, "undone": False}]

    llm = FixedLLM(kept)
    with ConversationEntityMemory.for_session(store, "s", llm=llm) as memory:
        memory.unmerge(1)
        assert memory.list_entities() == ["Sarah", kept, merged]
        memory.save_context({"input": kept}, {"output": "ok"})

    snippets = (
        "SELECT e.name, COUNT(*) FROM contexts c JOIN entities e ON e.id = c.entity_id "
        "GROUP BY e.name"
    )
    # The kept entity holds the key both names have now: the next mention joins it.
    assert dict(rows(store, snippets)) == {"Sarah": 1, kept: 2, merged: 1}


def test_an_entity_brought_back_apart_is_exported_and_imported_apart(
    store: Store, tmp_path: Path
) -> None:
    save_turns(store, "s", [["Sarah", "Müller"], ["Muller"]])
    migrate.upgrade(store)
    with ConversationEntityMemory.for_session(store, "s") as memory:
        memory.unmerge(1)
    exported = tmp_path / "s.jsonl"
    url = store.url.render_as_string(hide_password=False)

    succeeded(invoke(url, "export", "--session", "s", "-o", str(exported)))
    succeeded(invoke(url, "import", str(exported), "--session", "copy"))

    with ConversationEntityMemory.for_session(store, "copy") as memory:
        assert memory.list_entities() == ["Sarah", "Müller", "Muller"]
    assert (
        dict(rows(store, KEYS, session="copy"))["Muller"]
        == dict(rows(store, KEYS, session="s"))["Muller"]
    )


def test_a_merge_of_the_upgrade_can_be_undone_after_new_entities_and_snippets(
    store: Store,
) -> None:
    # "Muller" is the newest entity, and its snippet of the turn naming both is dropped by
    # the merge: the ids an unmerge puts back are the highest ever given.
    save_turns(store, "s", [["Sarah", "Müller"], ["Müller", "Muller"]])
    merged_ids = rows(store, "SELECT MAX(id) FROM entities UNION ALL SELECT MAX(id) FROM contexts")
    migrate.upgrade(store)

    with ConversationEntityMemory.for_session(store, "s", llm=FixedLLM("Ada")) as memory:
        memory.save_context({"input": "Ada"}, {"output": "ok"})  # takes new ids, not theirs
        memory.unmerge(1)
        assert memory.list_entities() == ["Sarah", "Müller", "Muller", "Ada"]
    assert rows(
        store, "SELECT id FROM entities WHERE name = 'Muller' UNION ALL "
        "SELECT MAX(c.id) FROM contexts c JOIN entities e ON e.id = c.entity_id "
        "WHERE e.name = 'Muller'",
    ) == merged_ids  # fmt: skip
