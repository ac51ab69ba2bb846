"""`demo` twice on the default SQLite file in the working folder: the second run finds what
the first one stored."""

from __future__ import annotations

import re
from pathlib import Path

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
    assert summary(second) == (5, 6, 12)

    stats = json_of(invoke(None, "stats", "--session", "demo", "--json"))
    assert (stats["entity_count"], stats["message_count"], stats["total_contexts"]) == (5, 6, 12)


def test_demo_on_the_database_of_the_url(database_url):
    out = succeeded(invoke(database_url, "demo")).stdout
    assert summary(out) == (5, 3, 6)
    assert [r["session_id"] for r in json_of(invoke(database_url, "sessions", "--json"))] == [
        "demo"
    ]
