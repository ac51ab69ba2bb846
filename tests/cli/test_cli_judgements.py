"""`similar confirm|reject|undo|judgements`: judging the pairs `entities --similar`
suggests, on a session written through the Python API, with --json and --by."""

from __future__ import annotations

import pytest

from tests.cli.helpers import invoke, json_of, succeeded, table_rows
from tests.doubles import KeywordLLM

SESSION = "crm"
NAMES = ("Mustafa Ali", "Moustafa Ali", "HSBC", "Hongkong and Shanghai Banking Corporation")


@pytest.fixture
def url(database_url, make_memory) -> str:
    memory = make_memory(KeywordLLM(NAMES), session_id=SESSION)
    memory.save_context({"input": "Mustafa Ali banks with HSBC."}, {"output": "ok"})
    memory.save_context(
        {"input": "Moustafa Ali, Hongkong and Shanghai Banking Corporation."}, {"output": "ok"}
    )
    return database_url


def similar(url: str) -> list[tuple[str, str, str]]:
    pairs = json_of(invoke(url, "entities", "--session", SESSION, "--similar", "--json"))
    return [(p["a"], p["b"], p["reason"]) for p in pairs]


def test_reject_then_undo_with_who_decided(url):
    assert ("HSBC", "Hongkong and Shanghai Banking Corporation", "acronym") in similar(url)
    judged = json_of(
        invoke(url, "similar", "reject", "HSBC", "Hongkong and Shanghai Banking Corporation",
               "--session", SESSION, "--by", "nadia", "--json")
    )  # fmt: skip
    assert (judged["verdict"], judged["decided_by"]) == ("different", "nadia")
    assert similar(url) == [("Mustafa Ali", "Moustafa Ali", "transliteration")]

    listing = succeeded(invoke(url, "similar", "judgements", "--session", SESSION))
    rows = table_rows(listing.stdout)
    assert rows[0] == ["a", "b", "verdict", "by", "when"]
    assert rows[1][2:4] == ["different", "nadia"]

    result = succeeded(
        invoke(url, "similar", "undo", "HSBC", "Hongkong and Shanghai Banking Corporation",
               "--session", SESSION)
    )  # fmt: skip
    assert "may be suggested again" in result.stdout
    assert len(similar(url)) == 2


def test_confirm_merges_and_undo_unmerges(url):
    result = succeeded(
        invoke(url, "similar", "confirm", "Mustafa Ali", "Moustafa Ali", "--session", SESSION)
    )
    assert "merged into 'Mustafa Ali'" in result.stdout
    assert "zerda-store similar undo" in result.stdout
    names = [e["name"] for e in json_of(invoke(url, "entities", "--session", SESSION, "--json"))]
    assert "Moustafa Ali" not in names
    (judged,) = json_of(invoke(url, "similar", "judgements", "--session", SESSION, "--json"))
    assert judged["verdict"] == "same" and judged["decided_by"]  # the operating-system user

    undone = json_of(
        invoke(url, "similar", "undo", "Moustafa Ali", "Mustafa Ali", "--session", SESSION,
               "--json")
    )  # fmt: skip
    assert undone["merge_id"] == judged["merge_id"]
    names = [e["name"] for e in json_of(invoke(url, "entities", "--session", SESSION, "--json"))]
    assert "Moustafa Ali" in names


def test_judging_an_unknown_name_is_one_line_error(url):
    result = invoke(url, "similar", "reject", "Nobody", "HSBC", "--session", SESSION)
    assert result.exit_code != 0
    assert "no entity 'Nobody'" in result.stderr
