"""Aliases and key rules through export, import and copy: an alias names its entity in
the copy too, the file names its key rules, and an older file keyed by the rules before
fold-v2 is re-keyed on import."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.cli.helpers import invoke, one_line_error, succeeded, url_maker
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory
from zerda_store.model.names import FOLD_V1

NAMES = ["Robert Smith", "Bobby", "Acme Corp"]


def seed(url: str, session_id: str = "s") -> None:
    with url_maker(url)(KeywordLLM(NAMES), session_id=session_id) as memory:
        memory.save_context({"input": "Robert Smith of Acme Corp"}, {"output": "ok"})
        memory.add_alias("Robert Smith", "Bobby")
        memory.add_alias("Acme Corp", "ACME Corporation")


def view(url: str, session_id: str) -> dict[str, object]:
    with ConversationEntityMemory(
        KeywordLLM(NAMES), database_url=url, session_id=session_id
    ) as memory:
        return {
            "entities": memory.list_entities(),
            "aliases": [(a["entity"], a["alias"], a["source"]) for a in memory.aliases()],
            "bobby": memory.get_entity_info("Bobby")["name"],
            "recall": memory.load_memory_variables({"input": "and Bobby?"}),
            "rules": memory.key_rules.name,
        }


def test_aliases_survive_export_and_import(database_url, tmp_path):
    seed(database_url)
    path = tmp_path / "s.jsonl"
    succeeded(invoke(database_url, "export", "--session", "s", "-o", str(path)))
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["key_rules"] == "fold-v2"
    assert [line["kind"] for line in lines].count("alias") == 2
    assert lines[-1]["aliases"] == 2

    succeeded(invoke(database_url, "import", str(path), "--session", "t"))
    assert view(database_url, "t") == view(database_url, "s")
    assert view(database_url, "t")["bobby"] == "Robert Smith"


@pytest.mark.fans_out
def test_aliases_survive_a_copy_to_another_database(database_url, tmp_path):
    destination = f"sqlite:///{tmp_path / 'copy.db'}"  # not the SQLite source's own file
    seed(database_url)
    succeeded(invoke(database_url, "copy", "--to", destination))
    assert view(destination, "s") == view(database_url, "s")


def test_a_file_keyed_by_the_older_rules_is_rekeyed_on_import(database_url, tmp_path):
    def line(record: dict[str, object]) -> str:
        return json.dumps(record, ensure_ascii=False) + "\n"

    body = [
        line({"kind": "session", "session_id": "old", "format": 2}),
        line(
            {"kind": "entity", "id": 1, "name_key": FOLD_V1.key("Acme Corp."), "name": "Acme Corp.",
             "entity_type": "ORG", "first_seen": 1.0, "last_seen": 1.0, "first_turn_id": 0,
             "first_position": 0}
        ),
        line({"kind": "context", "id": 1, "entity_id": 1, "turn_id": None, "turn_seq": 0,
              "text": "a note"}),
    ]  # fmt: skip
    digest = hashlib.sha256("".join(body).encode()).hexdigest()
    end = line({"kind": "end", "turns": 0, "entities": 1, "contexts": 1, "sha256": digest})
    path = Path(tmp_path / "old.jsonl")
    path.write_text("".join(body) + end, encoding="utf-8")

    succeeded(invoke(database_url, "import", str(path), "--session", "old"))
    with ConversationEntityMemory(database_url=database_url, session_id="old") as memory:
        assert memory.get_entity_info("Acme Corp")["recent_contexts"] == ["a note"]


def test_a_file_of_other_key_rules_is_refused_by_a_session_keyed_otherwise(database_url, tmp_path):
    with url_maker(database_url)(KeywordLLM(["Sarah"]), session_id="x") as memory:
        memory.save_context({"input": "Sarah"}, {"output": "ok"})
    with url_maker(database_url)(
        KeywordLLM(["Sarah"]), session_id="y", normalize_names=False
    ) as memory:
        memory.save_context({"input": "Sarah"}, {"output": "ok"})
    path = tmp_path / "x.jsonl"
    succeeded(invoke(database_url, "export", "--session", "x", "-o", str(path)))
    error = one_line_error(invoke(database_url, "import", str(path), "--session", "y", "--merge"))
    assert "keyed with the 'exact' key rules" in error


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _rewrite(path: Path, records: list[dict[str, object]]) -> Path:
    """``records`` (without an end line) as a whole file: counts and checksum recomputed."""
    body = [json.dumps(r, ensure_ascii=False) + "\n" for r in records if r["kind"] != "end"]
    counts = {"turns": 0, "entities": 0, "contexts": 0, "aliases": 0}
    for record in records:
        plural = {"turn": "turns", "entity": "entities", "context": "contexts", "alias": "aliases"}
        if record["kind"] in plural:
            counts[plural[str(record["kind"])]] += 1
    digest = hashlib.sha256("".join(body).encode()).hexdigest()
    end = json.dumps({"kind": "end", **counts, "sha256": digest}) + "\n"
    path.write_text("".join(body) + end, encoding="utf-8")
    return path


def _entity_id(records: list[dict[str, object]], name: str) -> object:
    return next(r["id"] for r in records if r["kind"] == "entity" and r["name"] == name)


def _alias(entity_id: object, alias: str) -> dict[str, object]:
    return {"kind": "alias", "entity_id": entity_id, "alias": alias, "source": "manual",
            "created_at": 1.0}  # fmt: skip


def _refused_import(database_url: str, path: Path, session_id: str) -> str:
    error = one_line_error(invoke(database_url, "import", str(path), "--session", session_id))
    with ConversationEntityMemory(database_url=database_url, session_id=session_id) as memory:
        assert memory.list_entities() == [] and memory.aliases() == []
    return error


def test_an_import_refuses_the_aliases_add_alias_refuses(database_url, tmp_path):
    seed(database_url)
    good = tmp_path / "s.jsonl"
    succeeded(invoke(database_url, "export", "--session", "s", "-o", str(good)))
    records = _records(good)[:-1]
    robert, acme = _entity_id(records, "Robert Smith"), _entity_id(records, "Acme Corp")
    for number, (alias, expected) in enumerate(
        [
            (_alias(robert, "acme corp"), "is the name of another entity"),
            (_alias(robert, "..."), "has no letters or digits"),
            (_alias(acme, "BOBBY"), "is an alias of another entity already"),
            (_alias(robert, "ROBERT SMITH"), "is the entity's own name"),
            (_alias(robert, "Bobby"), "a second alias"),
        ]
    ):
        bad = _rewrite(tmp_path / f"bad-{number}.jsonl", [*records, alias])
        error = _refused_import(database_url, bad, f"t{number}")
        assert f"line {len(records) + 1}" in error and "'alias'" in error, error
        assert expected in error, error


def test_an_import_refuses_an_entity_whose_core_key_is_missing_or_not_its_names(
    database_url, tmp_path
):
    seed(database_url)
    good = tmp_path / "s.jsonl"
    succeeded(invoke(database_url, "export", "--session", "s", "-o", str(good)))
    records = _records(good)[:-1]
    number = next(i for i, r in enumerate(records) if r["kind"] == "entity")
    for label, change in (("missing", None), ("wrong", "someone else")):
        entity = dict(records[number])
        if change is None:
            del entity["core_key"]
        else:
            entity["core_key"] = change
        bad = _rewrite(
            tmp_path / f"{label}.jsonl", [*records[:number], entity, *records[number + 1 :]]
        )
        error = _refused_import(database_url, bad, f"core-{label}")
        assert f"line {number + 1}" in error and "'core_key'" in error, error


def test_an_import_receipt_counts_the_aliases(database_url, tmp_path):
    seed(database_url)
    path = tmp_path / "s.jsonl"
    succeeded(invoke(database_url, "export", "--session", "s", "-o", str(path)))
    receipt = succeeded(invoke(database_url, "import", str(path), "--session", "t")).stdout
    assert receipt.strip().endswith("2 aliases"), receipt


def test_an_import_merged_into_a_session_refuses_an_alias_of_its_other_entities(
    database_url, tmp_path
):
    seed(database_url)
    path = tmp_path / "s.jsonl"
    succeeded(invoke(database_url, "export", "--session", "s", "-o", str(path)))
    with url_maker(database_url)(KeywordLLM(["Bobby", "Rob"]), session_id="u") as memory:
        memory.save_context({"input": "Bobby called"}, {"output": "ok"})
    with url_maker(database_url)(KeywordLLM(["Rob", "Robert"]), session_id="v") as memory:
        memory.save_context({"input": "Rob called"}, {"output": "ok"})
        memory.add_alias("Rob", "ACME Corporation")

    def entities(session_id: str) -> list[str]:
        with ConversationEntityMemory(database_url=database_url, session_id=session_id) as memory:
            return memory.list_entities()

    for session_id, before in (("u", ["Bobby"]), ("v", ["Rob"])):
        error = one_line_error(
            invoke(database_url, "import", str(path), "--session", session_id, "--merge")
        )
        assert "names another entity" in error and "nothing was imported" in error
        assert entities(session_id) == before


BOB_NAMES = ["Robert", "Bob", "Acme", "Bobster"]


def merged_into_roberts_session(url: str, tmp_path: Path, *source: str) -> None:
    """Session "src" saved with the inputs ``source`` (then "Bob" given the alias
    "Bobster" if it is an entity), exported, and imported with --merge into session "dst",
    where "Bob" is an alias of "Robert"."""
    make = url_maker(url)
    with make(KeywordLLM(BOB_NAMES), session_id="src") as memory:
        for text in source:
            memory.save_context({"input": text}, {"output": "ok"})
        if memory.get_entity_info("Bob") is not None:
            memory.add_alias("Bob", "Bobster")
    with make(KeywordLLM(BOB_NAMES), session_id="dst") as memory:
        memory.save_context({"input": "Robert signed"}, {"output": "ok"})
        memory.add_alias("Robert", "Bob")
    path = tmp_path / "src.jsonl"
    succeeded(invoke(url, "export", "--session", "src", "-o", str(path)))
    succeeded(invoke(url, "import", str(path), "--session", "dst", "--merge"))


def test_an_entity_merged_in_under_an_alias_of_the_session_joins_the_entity_it_names(
    database_url, tmp_path
):
    """The file's "Bob" imported with --merge into a session where "Bob" is an alias of
    "Robert": its snippets (and its own aliases) join Robert, as a saved turn naming Bob
    would; no second entity is made whose name is an alias."""
    merged_into_roberts_session(database_url, tmp_path, "Bob from Acme called", "Bob again")

    with url_maker(database_url)(KeywordLLM(BOB_NAMES), session_id="dst") as memory:
        assert memory.list_entities() == ["Robert", "Acme"]
        robert = memory.get_entity_info("Bob")
        assert robert["name"] == "Robert"
        assert robert["contexts_count"] == 3
        assert sorted(robert["aliases"]) == ["Bob", "Bobster"]
        assert memory.get_entity_info("Bobster")["name"] == "Robert"
        assert "Bob again" in memory.load_memory_variables({"input": "Robert?"})["entity_info"]


def test_two_entities_of_a_file_that_join_one_entity_by_an_alias(database_url, tmp_path):
    """The file holds "Robert" and "Bob" apart; the session has "Bob" as Robert's alias:
    both join Robert, one snippet per turn (and one statement may not update a row twice
    on Postgres)."""
    merged_into_roberts_session(database_url, tmp_path, "Robert and Bob met")

    with url_maker(database_url)(KeywordLLM(BOB_NAMES), session_id="dst") as memory:
        assert memory.list_entities() == ["Robert"]
        assert memory.get_entity_info("Robert")["contexts_count"] == 2
