"""`sessions`, `entities`, `entity` and `stats` on SQLite and Postgres: exit codes, the JSON
shape, the table, normalized look-ups, and one-line errors for what is not there."""

from __future__ import annotations

import datetime as dt
import time

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from tests.cli.helpers import (
    ACME_KEYED_TURN,
    ACME_LAST_TURN,
    ACME_NOTE,
    ACME_TURNS,
    GLOBEX_ENTITIES,
    SESSIONS,
    invoke,
    json_of,
    one_line_error,
    populate,
    succeeded,
    table_rows,
    text,
    url_maker,
)
from tests.doubles import FixedLLM
from zerda_store.cli import main

# Listings of every session read every shard on Citus.
pytestmark = pytest.mark.fans_out

STATS_KEYS = {
    "type",
    "entity_count",
    "message_count",
    "total_contexts",
    "extraction_errors",
    "last_extraction_error",
}


def day(timestamp: float) -> str:
    """A time as the listings show it: in UTC, labelled so (the fourth hardening round)."""
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def newest_activity(url: str, session_id: str) -> float:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return max(
                connection.execute(
                    sa.text(f"SELECT MAX({column}) FROM {table} WHERE session_id = :s"),
                    {"s": session_id},
                ).scalar_one()
                or 0.0
                for table, column in (("turns", "created_at"), ("entities", "last_seen"))
            )
    finally:
        engine.dispose()


# -- sessions -----------------------------------------------------------------------------


def test_sessions_json_lists_every_session_with_counts(database_url, make_memory):
    assert json_of(invoke(database_url, "sessions", "--json")) == []
    assert succeeded(invoke(database_url, "sessions")).stdout.strip() == "(none)"
    before = time.time()
    populate(make_memory)
    after = time.time()

    rows = json_of(invoke(database_url, "sessions", "--json"))

    assert [list(row) for row in rows] == [
        ["session_id", "entity_count", "message_count", "last_activity"]
    ] * 3
    assert [(r["session_id"], r["entity_count"], r["message_count"]) for r in rows] == [
        ("acme", 3, 6),
        ("globex", 4, 3),
        ("quiet", 0, 1),
    ]
    for row in rows:
        assert before <= row["last_activity"] <= after
        assert row["last_activity"] == newest_activity(database_url, row["session_id"])


def test_sessions_table_has_headers_and_values(shared_populated):
    result = succeeded(invoke(shared_populated, "sessions"))

    rows = table_rows(result.stdout)
    assert rows[0] == ["session_id", "entity_count", "message_count", "last_activity"]
    as_json = json_of(invoke(shared_populated, "sessions", "--json"))
    assert rows[1:] == [
        [r["session_id"], str(r["entity_count"]), str(r["message_count"]), day(r["last_activity"])]
        for r in as_json
    ]


def test_the_url_can_come_from_the_environment(shared_populated):
    result = CliRunner(env={"ZERDA_STORE_DATABASE_URL": shared_populated}).invoke(
        main, ["sessions", "--json"]
    )
    assert [r["session_id"] for r in json_of(result)] == ["acme", "globex", "quiet"]


# -- entities -----------------------------------------------------------------------------


def test_entities_json_in_first_seen_order(shared_populated):
    rows = json_of(invoke(shared_populated, "entities", "--session", "acme", "--json"))

    assert [list(row) for row in rows] == [
        ["name", "type", "contexts_count", "first_seen", "last_seen"]
    ] * 3
    assert [(r["name"], r["type"], r["contexts_count"]) for r in rows] == [
        ("Acme Corp", "unknown", 4),
        ("Sarah Chen", "unknown", 3),
        ("Berlin", "unknown", 1),
    ]
    with url_maker(shared_populated)(session_id="acme") as memory:
        infos = [memory.get_entity_info(row["name"]) for row in rows]
    for row, info in zip(rows, infos, strict=True):
        assert (row["first_seen"], row["last_seen"]) == (info["first_seen"], info["last_seen"])
    assert rows[0]["first_seen"] < rows[0]["last_seen"]


def test_entities_keep_types_and_non_latin_names(shared_populated):
    rows = json_of(invoke(shared_populated, "entities", "--session", "globex", "--json"))

    assert [(r["name"], r["type"], r["contexts_count"]) for r in rows] == [
        ("Omar Haddad", "PERSON", 2),
        ("Globex", "ORG", 2),
        ("أحمد", "PERSON", 1),
        ("Sarah Chen", "PERSON", 1),
    ]
    assert [r["name"] for r in rows] == GLOBEX_ENTITIES


def test_entities_table_has_headers_and_values(shared_populated):
    result = succeeded(invoke(shared_populated, "entities", "--session", "globex"))

    rows = table_rows(result.stdout)
    assert rows[0] == ["name", "type", "contexts_count", "first_seen", "last_seen"]
    as_json = json_of(invoke(shared_populated, "entities", "--session", "globex", "--json"))
    assert rows[1:] == [
        [r["name"], r["type"], str(r["contexts_count"]), day(r["first_seen"]), day(r["last_seen"])]
        for r in as_json
    ]
    assert "أحمد" in result.stdout


def test_entities_of_a_session_without_entities(shared_populated):
    assert json_of(invoke(shared_populated, "entities", "--session", "quiet", "--json")) == []
    result = succeeded(invoke(shared_populated, "entities", "--session", "quiet"))
    assert result.stdout.strip() == "(none)"


def test_entities_of_a_missing_session_fail_in_one_line(shared_populated):
    line = one_line_error(
        invoke(shared_populated, "entities", "--session", "nobody-here", "--json")
    )
    assert "nobody-here" in line
    assert "session" in line


# -- entity -------------------------------------------------------------------------------


def test_entity_json_is_get_entity_info_with_the_limit(shared_populated):
    with url_maker(shared_populated)(session_id="acme") as memory:
        expected = memory.get_entity_info("Acme Corp")
    acme_snippets = [
        text(ACME_TURNS[0]),
        text(ACME_KEYED_TURN),
        ACME_NOTE,
        text(ACME_LAST_TURN),
    ]

    info = json_of(invoke(shared_populated, "entity", "Acme Corp", "--session", "acme", "--json"))
    assert info == expected
    assert list(info) == [
        "name",
        "type",
        "contexts_count",
        "first_seen",
        "last_seen",
        "recent_contexts",
        "aliases",
    ]
    assert info["recent_contexts"] == acme_snippets[-3:]

    for limit in (1, 2, 10):
        limited = json_of(
            invoke(
                shared_populated,
                "entity",
                "Acme Corp",
                "--session",
                "acme",
                "--limit",
                str(limit),
                "--json",
            )
        )
        assert limited["recent_contexts"] == acme_snippets[-limit:]
        assert limited["contexts_count"] == 4
        assert {k: v for k, v in limited.items() if k != "recent_contexts"} == {
            k: v for k, v in info.items() if k != "recent_contexts"
        }


@pytest.mark.parametrize("limit", ["0", "-1", "10001", str(10**20), str(-(10**20))])
def test_entity_limit_out_of_range_fails_with_one_error_line(shared_populated, limit):
    result = invoke(shared_populated, "entity", "Acme Corp", "--session", "acme", "--limit", limit)

    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert errors == [
        f"Error: Invalid value for '--limit': {limit} is not in the range 1<=x<=10000."
    ]
    assert result.stdout == ""


def test_entity_limit_at_the_maximum_shows_every_snippet(shared_populated):
    info = json_of(
        invoke(
            shared_populated,
            "entity",
            "Acme Corp",
            "--session",
            "acme",
            "--limit",
            "10000",
            "--json",
        )
    )
    assert len(info["recent_contexts"]) == info["contexts_count"] == 4


@pytest.mark.parametrize("spelling", ["sarah chen", "  SARAH   chen ", "Sarah Chen"])
def test_entity_look_up_is_normalized(shared_populated, spelling):
    info = json_of(invoke(shared_populated, "entity", spelling, "--session", "acme", "--json"))
    assert info["name"] == "Sarah Chen"
    assert info["contexts_count"] == 3
    assert info["recent_contexts"] == [text(t) for t in ACME_TURNS]


def test_entity_table_shows_the_snippets(shared_populated):
    result = succeeded(invoke(shared_populated, "entity", "sarah chen", "--session", "acme"))

    out = result.stdout
    assert out.splitlines()[0] == "Sarah Chen (unknown)"
    assert "snippets:   3" in out
    info = json_of(invoke(shared_populated, "entity", "Sarah Chen", "--session", "acme", "--json"))
    assert f"first seen: {day(info['first_seen'])}" in out
    assert f"last seen:  {day(info['last_seen'])}" in out
    for turn in ACME_TURNS:
        assert f"    - {text(turn)}" in out


def test_entity_lists_are_per_session(shared_populated):
    one_line_error(invoke(shared_populated, "entity", "Omar Haddad", "--session", "acme"))
    info = json_of(
        invoke(shared_populated, "entity", "omar haddad", "--session", "globex", "--json")
    )
    assert (info["name"], info["type"]) == ("Omar Haddad", "PERSON")


@pytest.mark.parametrize(
    ("name", "session"), [("Nobody", "acme"), ("Sarah Chen", "no-such-session")]
)
def test_entity_not_found_fails_in_one_line(shared_populated, name, session):
    line = one_line_error(invoke(shared_populated, "entity", name, "--session", session, "--json"))
    assert repr(name) in line
    assert repr(session) in line


# -- stats --------------------------------------------------------------------------------


def test_stats_of_one_session_json_has_the_get_memory_stats_keys(shared_populated):
    stats = json_of(invoke(shared_populated, "stats", "--session", "acme", "--json"))

    assert set(stats) >= STATS_KEYS
    assert set(stats) - STATS_KEYS <= {"session_id"}
    with url_maker(shared_populated)(session_id="acme") as memory:
        expected = memory.get_memory_stats()
    for field in ("type", "entity_count", "message_count", "total_contexts"):
        assert stats[field] == expected[field]
    assert (stats["entity_count"], stats["message_count"], stats["total_contexts"]) == (3, 6, 8)


def test_stats_of_every_session(shared_populated):
    rows = json_of(invoke(shared_populated, "stats", "--json"))

    assert [r["session_id"] for r in rows] == ["acme", "globex", "quiet"]
    for row in rows:
        assert set(row) >= STATS_KEYS
    assert [(r["entity_count"], r["message_count"], r["total_contexts"]) for r in rows] == [
        (3, 6, 8),
        (4, 3, 6),
        (0, 1, 0),
    ]


def test_stats_table_has_headers_and_values(shared_populated):
    rows = table_rows(succeeded(invoke(shared_populated, "stats")).stdout)
    assert rows == [
        ["session_id", "entity_count", "message_count", "total_contexts"],
        ["acme", "3", "6", "8"],
        ["globex", "4", "3", "6"],
        ["quiet", "0", "1", "0"],
    ]
    one = table_rows(succeeded(invoke(shared_populated, "stats", "--session", "globex")).stdout)
    assert one == [
        ["session_id", "entity_count", "message_count", "total_contexts"],
        ["globex", "4", "3", "6"],
    ]


def test_stats_of_a_missing_session_fails_in_one_line(shared_populated):
    line = one_line_error(invoke(shared_populated, "stats", "--session", "ghost", "--json"))
    assert "ghost" in line


def test_listings_do_not_write(shared_populated):
    """Looking is read-only: no command of this file adds a session or a row."""
    before = json_of(invoke(shared_populated, "stats", "--json"))
    invoke(shared_populated, "entity", "Nobody", "--session", "new-session")
    invoke(shared_populated, "entities", "--session", "new-session")
    invoke(shared_populated, "stats", "--session", "new-session")
    assert json_of(invoke(shared_populated, "stats", "--json")) == before


def test_sessions_are_per_database(shared_populated, tmp_path):
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with url_maker(other)(FixedLLM(""), session_id="elsewhere") as memory:
        memory.save_context({"input": "x"}, {"output": "y"})

    listed = json_of(invoke(shared_populated, "sessions", "--json"))
    assert [r["session_id"] for r in listed] == list(SESSIONS)
    listed = json_of(invoke(other, "sessions", "--json"))
    assert [(r["session_id"], r["message_count"]) for r in listed] == [("elsewhere", 1)]
