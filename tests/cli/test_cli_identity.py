"""The identity commands: `alias add|remove|list`, `merge`, `unmerge`, `merges` and
`entities --similar`, on a session written through the Python API."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of, key, one_line_error, succeeded, table_rows
from tests.doubles import KeywordLLM
from zerda_store.db.schema import entities, entity_merges

SESSION = "crm"
VOCABULARY = ("Sarah Chen", "Sarah", "Acme's", "Acme", "Berlin")
TURNS = (
    ("Sarah Chen from Acme called.", "Noted."),
    ("Sarah wants Acme's quote in Berlin.", "The quote is coming."),
    ("Sarah asked again.", "I will chase it."),
    ("Sarah Chen signed the order.", "Great news."),
)
NAMES = ["Sarah Chen", "Acme", "Sarah", "Acme's", "Berlin"]


@pytest.fixture
def url(database_url, make_memory) -> str:
    """A database holding the session "crm" with near-duplicate names."""
    memory = make_memory(KeywordLLM(VOCABULARY), session_id=SESSION)
    for user, assistant in TURNS:
        memory.save_context({"input": user}, {"output": assistant})
    return database_url


def listed(url: str) -> list[dict[str, Any]]:
    return json_of(invoke(url, "entities", "--session", SESSION, "--json"))


def counts(url: str) -> dict[str, int]:
    return {row["name"]: row["contexts_count"] for row in listed(url)}


def rows_of(url: str, table: sa.Table, *condition: Any) -> list[Any]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            return connection.execute(
                sa.select(table).where(table.c.session_id == SESSION, *condition)
            ).all()
    finally:
        engine.dispose()


def entity_row(url: str, name: str) -> Any:
    found = rows_of(url, entities, entities.c.name_key == key(name))
    return found[0] if found else None


# -- aliases -------------------------------------------------------------------------------


def test_an_added_alias_names_the_entity_until_it_is_removed(url):
    assert "Roadrunner" in one_line_error(invoke(url, "entity", "Roadrunner", "--session", SESSION))

    result = succeeded(invoke(url, "alias", "add", "Acme", "Roadrunner", "--session", SESSION))
    assert result.stdout.strip() == "'Roadrunner' is now an alias of 'Acme'"
    again = succeeded(invoke(url, "alias", "add", "Acme", "Roadrunner", "--session", SESSION))
    assert "already" in again.stdout

    found = json_of(invoke(url, "entity", "Roadrunner", "--session", SESSION, "--json"))
    assert (found["name"], found["contexts_count"]) == ("Acme", 1)
    assert json_of(invoke(url, "alias", "list", "--session", SESSION, "--json")) == [
        {"entity": "Acme", "alias": "Roadrunner", "source": "manual"}
    ]
    table = table_rows(succeeded(invoke(url, "alias", "list", "--session", SESSION)).stdout)
    assert table == [["entity", "alias", "source"], ["Acme", "Roadrunner", "manual"]]
    assert [row["name"] for row in listed(url)] == NAMES  # an alias is no entity

    removed = succeeded(invoke(url, "alias", "remove", "Roadrunner", "--session", SESSION))
    assert removed.stdout.strip() == "removed the alias 'Roadrunner'"
    one_line_error(invoke(url, "entity", "Roadrunner", "--session", SESSION))
    line = one_line_error(invoke(url, "alias", "remove", "Roadrunner", "--session", SESSION))
    assert line == f"Error: no alias 'Roadrunner' in session {SESSION!r}"
    assert succeeded(invoke(url, "alias", "list", "--session", SESSION)).stdout == "(none)\n"


def test_alias_add_and_remove_print_a_json_receipt(url):
    add = ["alias", "add", "Acme", "Roadrunner", "--session", SESSION, "--json"]

    added = json_of(invoke(url, *add))
    again = json_of(invoke(url, *add))
    removed = json_of(invoke(url, "alias", "remove", "Roadrunner", "--session", SESSION, "--json"))

    assert added == {"alias": "Roadrunner", "entity": "Acme", "added": True}
    assert again == {"alias": "Roadrunner", "entity": "Acme", "added": False}
    assert removed == {"alias": "Roadrunner", "removed": True}
    assert json_of(invoke(url, "alias", "list", "--session", SESSION, "--json")) == []


def test_an_alias_that_is_another_entity_or_of_no_entity_is_refused(url):
    line = one_line_error(invoke(url, "alias", "add", "Sarah Chen", "Sarah", "--session", SESSION))
    assert "merge" in line
    line = one_line_error(invoke(url, "alias", "add", "Nobody", "Nobo", "--session", SESSION))
    assert "'Nobody'" in line
    assert json_of(invoke(url, "alias", "list", "--session", SESSION, "--json")) == []


# -- merge, merges, unmerge ----------------------------------------------------------------


def test_a_merge_is_logged_and_the_merged_name_is_no_entity(url):
    before = counts(url)
    sarah = entity_row(url, "Sarah")

    receipt = json_of(invoke(url, "merge", "Sarah Chen", "sarah", "--session", SESSION, "--json"))

    assert receipt == {
        "merge_id": receipt["merge_id"],
        "kept": "Sarah Chen",
        "merged": "Sarah",
        "moved_snippets": 2,
        "dropped_snippets": 0,
        "moved_aliases": 0,
    }
    assert entity_row(url, "Sarah") is None
    assert [row["name"] for row in listed(url)] == ["Sarah Chen", "Acme", "Acme's", "Berlin"]
    assert counts(url)["Sarah Chen"] == before["Sarah Chen"] + before["Sarah"]
    # the merged name now names the kept entity
    found = json_of(invoke(url, "entity", "Sarah", "--session", SESSION, "--json"))
    assert found["name"] == "Sarah Chen"
    assert json_of(invoke(url, "alias", "list", "--session", SESSION, "--json")) == [
        {"entity": "Sarah Chen", "alias": "Sarah", "source": "merge"}
    ]

    log = json_of(invoke(url, "merges", "--session", SESSION, "--json"))
    assert [(m["merge_id"], m["kept"], m["merged"], m["reason"]) for m in log] == [
        (receipt["merge_id"], "Sarah Chen", "Sarah", "manual")
    ]
    assert log[0]["undone_at"] is None and log[0]["moved_snippets"] == 2
    (stored,) = rows_of(url, entity_merges)
    assert (stored.id, stored.merged_entity_id) == (receipt["merge_id"], sarah.id)

    table = table_rows(succeeded(invoke(url, "merges", "--session", SESSION)).stdout)
    assert table[0] == ["id", "kept", "merged", "reason", "when", "undone"]
    assert table[1][:4] == [str(receipt["merge_id"]), "Sarah Chen", "Sarah", "manual"]
    assert table[1][5] == "-"


def test_merge_says_how_to_undo_it(url):
    result = succeeded(invoke(url, "merge", "Acme", "Acme's", "--session", SESSION))
    (merge_id,) = [row.id for row in rows_of(url, entity_merges)]
    assert result.stdout.splitlines() == [
        f"merged \"Acme's\" into 'Acme' (merge {merge_id}): 1 snippet moved, 0 dropped "
        "(same turn), 0 aliases moved",
        f"undo with: zerda-store unmerge {merge_id} --session {SESSION}",
    ]


def test_unmerge_puts_both_entities_back_and_twice_fails(url):
    before = listed(url)
    sarah = entity_row(url, "Sarah")
    receipt = json_of(invoke(url, "merge", "Sarah Chen", "Sarah", "--session", SESSION, "--json"))
    merge_id = str(receipt["merge_id"])

    undone = json_of(invoke(url, "unmerge", merge_id, "--session", SESSION, "--json"))

    assert (undone["merge_id"], undone["kept"], undone["merged"]) == (
        receipt["merge_id"],
        "Sarah Chen",
        "Sarah",
    )
    assert undone["undone_at"] is not None
    assert listed(url) == before  # names, snippet counts, first and last seen
    assert entity_row(url, "Sarah").id == sarah.id
    assert json_of(invoke(url, "alias", "list", "--session", SESSION, "--json")) == []
    (entry,) = json_of(invoke(url, "merges", "--session", SESSION, "--json"))
    assert entry["undone_at"] == undone["undone_at"]
    table = table_rows(succeeded(invoke(url, "merges", "--session", SESSION)).stdout)
    assert table[1][5] != "-"

    line = one_line_error(invoke(url, "unmerge", merge_id, "--session", SESSION))
    assert line == f"Error: merge {merge_id} was undone already"
    assert listed(url) == before

    human = succeeded(invoke(url, "merge", "Sarah Chen", "Sarah", "--session", SESSION))
    second = human.stdout.split("(merge ")[1].split(")")[0]
    result = succeeded(invoke(url, "unmerge", second, "--session", SESSION))
    assert result.stdout.strip() == (
        f"undid merge {second}: 'Sarah Chen' and 'Sarah' are two entities again"
    )
    assert listed(url) == before


def test_merging_what_is_not_there_fails_in_one_line_and_changes_nothing(url):
    before = listed(url)
    for args, expected in (
        (("merge", "Nobody", "Sarah"), "no entity 'Nobody'"),
        (("merge", "Sarah", "Nobody"), "no entity 'Nobody'"),
        (("merge", "Sarah", "sarah"), "one entity already"),
        (("unmerge", "42"), "no merge 42"),
    ):
        line = one_line_error(invoke(url, *args, "--session", SESSION))
        assert expected in line, args
    line = one_line_error(invoke(url, "merge", "Sarah Chen", "Sarah", "--session", "nope"))
    assert line == "Error: no session 'nope' in this database"
    assert "Invalid value" in invoke(url, "unmerge", "0", "--session", SESSION).stderr
    assert listed(url) == before
    assert json_of(invoke(url, "merges", "--session", SESSION, "--json")) == []
    assert rows_of(url, entity_merges) == []


# -- entities --similar --------------------------------------------------------------------


def test_similar_lists_likely_duplicates_and_how_to_merge_them(url):
    pairs = json_of(invoke(url, "entities", "--session", SESSION, "--similar", "--json"))
    assert {(frozenset((p["a"], p["b"])), p["reason"]) for p in pairs} == {
        (frozenset(("Sarah", "Sarah Chen")), "first name"),
        (frozenset(("Acme's", "Acme")), "possessive"),
    }

    result = succeeded(invoke(url, "entities", "--session", SESSION, "--similar"))
    *table, hint = result.stdout.splitlines()
    rows = table_rows("\n".join(table))
    assert rows[0] == ["a", "b", "reason", "score"]
    assert sorted(rows[1:]) == sorted([p["a"], p["b"], p["reason"], str(p["score"])] for p in pairs)
    assert "never merged automatically" in hint
    assert f"zerda-store similar confirm A B --session {SESSION}" in hint
    assert f"zerda-store similar reject A B --session {SESSION}" in hint
    assert len(listed(url)) == len(NAMES)  # only suggested

    # once merged, the pair is no longer suggested
    succeeded(invoke(url, "merge", "Acme", "Acme's", "--session", SESSION))
    pairs = json_of(invoke(url, "entities", "--session", SESSION, "--similar", "--json"))
    assert [p["reason"] for p in pairs] == ["first name"]


# -- read-only ---------------------------------------------------------------------------


def test_read_only_refuses_the_writing_commands_and_reads(url):
    before = listed(url)
    for command in (
        ["alias", "add", "Acme", "Roadrunner"],
        ["alias", "remove", "Roadrunner"],
        ["merge", "Sarah Chen", "Sarah"],
        ["unmerge", "1"],
    ):
        line = one_line_error(invoke(url, "--read-only", *command, "--session", SESSION))
        assert "read-only" in line, command
    assert listed(url) == before
    for command in (
        ["alias", "list", "--json"],
        ["merges", "--json"],
        ["entities", "--similar", "--json"],
    ):
        assert isinstance(json_of(invoke(url, "--read-only", *command, "--session", SESSION)), list)


def test_reading_commands_create_no_database(tmp_path):
    mistyped = tmp_path / "memroy.db"
    for command in (["alias", "list"], ["merges"], ["entities", "--similar"]):
        line = one_line_error(invoke(f"sqlite:///{mistyped}", *command, "--session", SESSION))
        assert line == f"Error: no database file at {mistyped}", command
    assert list(tmp_path.iterdir()) == []


def test_reading_commands_name_a_missing_session(url):
    for command in (["alias", "list"], ["merges"], ["entities", "--similar"]):
        line = one_line_error(invoke(url, *command, "--session", "nope"))
        assert line == "Error: no session 'nope' in this database", command


def test_similar_limit_keeps_the_likeliest_pairs_and_refuses_a_bad_limit(url):
    every = json_of(invoke(url, "entities", "--session", SESSION, "--similar", "--json"))
    first = json_of(
        invoke(url, "entities", "--session", SESSION, "--similar", "--limit", "1", "--json")
    )
    assert first == every[:1] and first[0]["reason"] == "possessive"
    bad = invoke(url, "entities", "--session", SESSION, "--similar", "--limit", str(2**31))
    assert bad.exit_code != 0 and "Traceback" not in bad.output
