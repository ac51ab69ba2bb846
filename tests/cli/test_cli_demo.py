"""`demo` twice on the default SQLite file in the working folder: the second run finds what
the first one stored, and its deliveries of the same turns (same idempotency keys) store
nothing twice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.helpers import invoke, json_of, succeeded

SUMMARY = re.compile(r"^(\d+) entities, (\d+) turns, (\d+) snippets stored in session 'demo'\.$")


def summary(output: str) -> tuple[int, int, int]:
    match = SUMMARY.match(output.strip().splitlines()[-1])
    assert match, output
    return tuple(int(n) for n in match.groups())


def test_demo_twice_the_memory_survives(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    first = succeeded(invoke(None, "demo")).stdout
    assert first.startswith("A new, empty memory.")
    assert "sqlite:///zerda_store.db" in first
    assert "remembered: Acme Corp, Sarah Chen" in first
    assert "Previous information about Sarah Chen:" in first
    assert summary(first) == (5, 3, 6)
    assert (tmp_path / "zerda_store.db").is_file()

    second = succeeded(invoke(None, "demo")).stdout
    assert "already holds 3 turns from earlier runs: it survived." in second.splitlines()[0]
    assert "A new, empty memory." not in second
    assert second.count("already stored by an earlier run") == 3
    assert summary(second) == (5, 3, 6)

    stats = json_of(invoke(None, "stats", "--session", "demo", "--json"))
    assert (stats["entity_count"], stats["message_count"], stats["total_contexts"]) == (5, 3, 6)


def test_demo_second_run_recalls_each_snippet_once(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    succeeded(invoke(None, "demo"))

    second = succeeded(invoke(None, "demo")).stdout

    procurement = "Sarah Chen is our new head of procurement."
    recalled = second.split("user asks: What did Sarah Chen ask for?")[1]
    assert recalled.count(procurement) == 1
    assert "remembered:" not in second


@pytest.mark.fans_out
def test_demo_on_the_database_of_the_url(database_url):
    out = succeeded(invoke(database_url, "demo")).stdout
    assert summary(out) == (5, 3, 6)
    assert [r["session_id"] for r in json_of(invoke(database_url, "sessions", "--json"))] == [
        "demo"
    ]


def test_demo_on_an_empty_database_creates_the_schema(empty_database_url):
    out = succeeded(invoke(empty_database_url, "demo")).stdout

    assert out.startswith("A new, empty memory.")
    assert summary(out) == (5, 3, 6)
    assert "(head)" in succeeded(invoke(empty_database_url, "db", "current")).stdout


def test_demo_json_says_what_each_run_stored(empty_database_url):
    first = json_of(invoke(empty_database_url, "demo", "--json"))
    second = json_of(invoke(empty_database_url, "demo", "--json"))

    assert first["stored_now"] == ["demo-turn-1", "demo-turn-2", "demo-turn-3"]
    assert (first["earlier_turns"], first["entities"], first["turns"], first["snippets"]) == (
        0,
        5,
        3,
        6,
    )
    assert second["stored_now"] == []
    assert (second["earlier_turns"], second["turns"], second["snippets"]) == (3, 3, 6)
    assert second["recalled"] == first["recalled"]
