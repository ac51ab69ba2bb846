"""What a retention policy hides from the API's reads, the command line hides too:
`entities`, `sessions`, `alias list`, `entity`, `copy`; `export` skips it unless
`--include-expired`, which says so. Data is written with an old clock (epoch 1,000,000,
1970) or the real one, and the command reads at the real time."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded
from tests.doubles import Clock, TypedNames

DAY = 86_400.0
OLD = 1_000_000.0


def memory(make_memory, session_id: str, now: float):
    return make_memory(extractor=TypedNames(), session_id=session_id, clock=Clock(now))


def save(memory, names: str, text: str) -> None:
    memory.save_context({"input": f"{names} | {text}"}, {"output": "ok"})


def exported(url: str, session_id: str, *extra: str) -> tuple[dict[str, int], str]:
    """The kinds of records `export` writes and what it says on standard error."""
    result = succeeded(invoke(url, "export", "--session", session_id, "-o", "-", *extra))
    counts: dict[str, int] = {}
    for line in result.stdout.splitlines():
        record = json.loads(line)
        kind = record.get("kind", "header")
        counts[kind] = counts.get(kind, 0) + 1
    return counts, result.stderr


def api(make_memory, session_id: str) -> Any:
    return make_memory(extractor=TypedNames(), session_id=session_id)


@pytest.fixture
def kept_two(make_memory, database_url) -> str:
    """Session "k": five turns naming Sarah and Acme (ten snippets), keep_last=2."""
    m = memory(make_memory, "k", time.time())
    for n in range(5):
        save(m, "Sarah/PERSON, Acme/ORG", f"note {n}")
    m.set_retention(keep_last=2)
    return database_url


@pytest.fixture
def aged(make_memory, database_url) -> str:
    """Session "a": three turns of 1970 naming Old, two of now naming New, max_age=1 day."""
    old = memory(make_memory, "a", OLD)
    for n in range(3):
        save(old, "Old/PERSON", f"long ago {n}")
    new = memory(make_memory, "a", time.time())
    for n in range(2):
        save(new, "New/PERSON", f"today {n}")
    new.set_retention(max_age=DAY)
    return database_url


@pytest.fixture
def idle(make_memory, database_url) -> str:
    """Session "i": idle since 1970 (session_idle=1 day), Sarah with an alias; session "f",
    fresh, with an alias too."""
    old = memory(make_memory, "i", OLD)
    save(old, "Sarah Chen/PERSON", "long ago")
    old.add_alias("Sarah Chen", "Sally")
    old.set_retention(session_idle=DAY)
    fresh = memory(make_memory, "f", time.time())
    save(fresh, "Omar/PERSON", "today")
    fresh.add_alias("Omar", "Omi")
    return database_url


def test_entities_count_only_the_snippets_keep_last_keeps(kept_two, make_memory):
    listed = json_of(invoke(kept_two, "entities", "--session", "k", "--json"))
    info = api(make_memory, "k").get_entity_info("Sarah")

    assert [(e["name"], e["contexts_count"]) for e in listed] == [("Sarah", 2), ("Acme", 2)]
    assert info["contexts_count"] == 2
    shown = json_of(invoke(kept_two, "entity", "Sarah", "--session", "k", "--json", "--limit", "9"))
    assert shown["contexts_count"] == 2 and len(shown["recent_contexts"]) == 2


def test_export_skips_what_keep_last_hides_unless_asked(kept_two, make_memory):
    counts, said = exported(kept_two, "k")
    everything, said_all = exported(kept_two, "k", "--include-expired")

    assert (counts["context"], counts["turn"], counts["entity"]) == (4, 5, 2)
    assert api(make_memory, "k").get_memory_stats()["total_contexts"] == 4
    assert "expired" not in said
    assert everything["context"] == 10
    assert "including expired data" in said_all


def test_entities_sessions_and_export_hide_what_max_age_expired(aged, make_memory):
    listed = json_of(invoke(aged, "entities", "--session", "a", "--json"))
    stats = api(make_memory, "a").get_memory_stats()
    counts, _ = exported(aged, "a")
    everything, _ = exported(aged, "a", "--include-expired")

    assert [e["name"] for e in listed] == ["New"]
    assert listed[0]["contexts_count"] == 2
    assert (stats["entity_count"], stats["message_count"]) == (1, 2)
    assert (counts["turn"], counts["entity"], counts["context"]) == (2, 1, 2)
    assert (everything["turn"], everything["entity"], everything["context"]) == (5, 2, 5)
    refused = one_line_error(invoke(aged, "entity", "Old", "--session", "a"))
    assert "no entity 'Old'" in refused


def test_an_idle_session_lists_no_aliases_and_exports_nothing(idle, make_memory):
    assert api(make_memory, "i").aliases() == []
    assert api(make_memory, "f").aliases() == [
        {"entity": "Omar", "alias": "Omi", "source": "manual"}
    ]
    assert json_of(invoke(idle, "alias", "list", "--session", "i", "--json")) == []
    assert json_of(invoke(idle, "entities", "--session", "i", "--json")) == []
    counts, _ = exported(idle, "i")
    assert counts.get("turn", 0) == counts.get("entity", 0) == counts.get("alias", 0) == 0


@pytest.mark.fans_out
def test_sessions_counts_what_shows_and_leaves_out_a_session_of_which_nothing_shows(aged, idle):
    sessions = {s["session_id"]: s for s in json_of(invoke(aged, "sessions", "--json"))}

    assert sorted(sessions) == ["a", "f"]
    assert (sessions["a"]["entity_count"], sessions["a"]["message_count"]) == (1, 2)


def _target_counts(url: str, session_id: str) -> dict[str, int]:
    from zerda_store import Store
    from zerda_store.admin import AdminRepository

    with Store(url) as store:
        counts: dict[str, int] = {}
        for record in AdminRepository(store).export_session(session_id, include_expired=True):
            counts[record["kind"]] = counts.get(record["kind"], 0) + 1
        return counts


@pytest.mark.fans_out
def test_copy_copies_what_the_reads_show(kept_two, aged, tmp_path):
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    report = json_of(invoke(kept_two, "copy", "--to", target, "--json"))

    assert report == {"copied": 2, "skipped": 0, "default_rules": 0, "session_rules": 2}
    assert _target_counts(target, "k") == {"turn": 5, "entity": 2, "context": 4}
    assert _target_counts(target, "a") == {"turn": 2, "entity": 1, "context": 2}


@pytest.mark.fans_out
def test_copy_include_expired_copies_everything(aged, tmp_path):
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    succeeded(invoke(aged, "copy", "--to", target, "--include-expired"))

    assert _target_counts(target, "a") == {"turn": 5, "entity": 2, "context": 5}


def test_a_snippet_shown_whose_turn_expired_is_exported_without_it(
    make_memory, database_url, tmp_path
):
    """Turns age by every type's max_age (1 day), ORG snippets by their own (10,000 days):
    a 1970 turn is hidden while its ORG snippet shows; the export writes the snippet as a
    note (no turn), and the file imports."""
    old = memory(make_memory, "o", time.time() - 30 * DAY)
    save(old, "Acme/ORG, Sarah/PERSON", "last month")
    old.set_retention(max_age=DAY)
    old.set_retention(max_age=10_000 * DAY, entity_type="ORG")
    path = tmp_path / "o.jsonl"
    succeeded(invoke(database_url, "export", "--session", "o", "-o", str(path)))
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    assert [r.get("kind") for r in records[1:-1]] == ["entity", "context"]
    assert records[2]["turn_id"] is None
    assert api(make_memory, "o").get_entity_info("Acme")["recent_contexts"] == [
        "Acme/ORG, Sarah/PERSON | last month ok"
    ]
    succeeded(invoke(database_url, "import", str(path), "--session", "p"))
    assert api(make_memory, "p").list_entities() == ["Acme"]


# -- H3 (fourth hardening round): policies travel with the data ----------------------------


def _names(url: str, session_id: str) -> list[str]:
    return [e["name"] for e in json_of(invoke(url, "entities", "--session", session_id, "--json"))]


def _rule(url: str, *scope: str) -> dict:
    shown = json_of(invoke(url, "retention", "show", *scope, "--json"))
    return {k: shown[k] for k in ("keep_last", "max_age", "session_idle")}


@pytest.mark.fans_out  # lists or copies every session
def test_copy_carries_the_default_and_the_sessions_policies(aged, tmp_path):
    succeeded(invoke(aged, "retention", "set", "--default", "--keep-last", "5"))
    target = f"sqlite:///{tmp_path / 'copy.db'}"

    result = succeeded(invoke(aged, "copy", "--to", target, "--include-expired"))

    assert "retention rules carried: 1 of the default, 1 of sessions" in result.stdout
    assert _rule(target, "--default") == {"keep_last": 5, "max_age": None, "session_idle": None}
    assert _rule(target, "--session", "a") == {
        "keep_last": None,
        "max_age": DAY,
        "session_idle": None,
    }
    assert _names(target, "a") == ["New"]  # what expired at the source is hidden here too


def test_export_and_import_carry_the_sessions_policy(aged, tmp_path):
    path = tmp_path / "a.jsonl"
    exported = succeeded(
        invoke(aged, "export", "--session", "a", "--include-expired", "-o", str(path))
    )
    assert "1 retention rule carried" in exported.stderr
    target = f"sqlite:///{tmp_path / 'target.db'}"

    result = succeeded(invoke(target, "import", str(path), "--session", "a"))

    assert "its retention policy carried (1 rule)" in result.stdout
    assert _rule(target, "--session", "a")["max_age"] == DAY
    assert _names(target, "a") == ["New"]


def test_an_import_keeps_the_sources_default_as_the_sessions_own_policy(kept_two, tmp_path):
    succeeded(invoke(kept_two, "retention", "clear", "--yes", "--session", "k"))
    succeeded(invoke(kept_two, "retention", "set", "--default", "--keep-last", "2"))
    path = tmp_path / "k.jsonl"
    succeeded(invoke(kept_two, "export", "--session", "k", "--include-expired", "-o", str(path)))
    target = f"sqlite:///{tmp_path / 'target.db'}"

    receipt = json_of(invoke(target, "import", str(path), "--session", "k", "--json"))

    assert (receipt["retention"], receipt["retention_rules"]) == ("default", 1)
    assert _rule(target, "--session", "k")["keep_last"] == 2
    entities = json_of(invoke(target, "entities", "--session", "k", "--json"))
    assert [e["contexts_count"] for e in entities] == [2, 2]


# -- the fourth hardening round: erasure reaches what expired but is not pruned ---------------


@pytest.mark.fans_out  # lists or copies every session
def test_forget_with_turns_erases_an_expired_session_as_the_api_does(idle, tmp_path):
    listed = json_of(invoke(idle, "sessions", "--include-expired", "--json"))
    assert [s["session_id"] for s in listed] == ["f", "i"]
    assert [s["session_id"] for s in json_of(invoke(idle, "sessions", "--json"))] == ["f"]

    receipt = json_of(
        invoke(idle, "forget", "--yes", "Sarah Chen", "--session", "i", "--with-turns", "--json")
    )

    assert (receipt["entities"], receipt["contexts"], receipt["turns_deleted"]) == (1, 1, 1)
    listed = json_of(invoke(idle, "sessions", "--include-expired", "--json"))
    assert [s["session_id"] for s in listed] == ["f"]  # nothing of "i" is left
    line = one_line_error(invoke(idle, "forget", "--yes", "Sarah Chen", "--session", "i"))
    assert "no entity 'Sarah Chen'" in line
