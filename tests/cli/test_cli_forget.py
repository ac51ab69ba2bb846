"""`forget NAME --session S [--with-turns]`: the receipt, and afterwards no trace of the
entity in any table or view of the session; other sessions keep theirs."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.cli.helpers import (
    canonical,
    export_records,
    invoke,
    json_of,
    key,
    one_line_error,
    populate,
    succeeded,
    url_maker,
)
from zerda_store.db.schema import contexts, entities, extractions, turns


def session_rows(url: str, session_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of the session in every table and view that has a session_id column."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        names = inspector.get_table_names() + inspector.get_view_names()
        found = {}
        with engine.connect() as connection:
            for name in names:
                if "session_id" not in {c["name"] for c in inspector.get_columns(name)}:
                    continue
                table = sa.Table(name, sa.MetaData(), autoload_with=connection)
                rows = connection.execute(
                    sa.select(table).where(table.c.session_id == session_id)
                ).mappings()
                found[name] = [dict(row) for row in rows]
        return found
    finally:
        engine.dispose()


def entity_row(url: str, session_id: str, name: str) -> Any:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(
                sa.select(entities).where(
                    entities.c.session_id == session_id, entities.c.name_key == key(name)
                )
            ).one_or_none()
    finally:
        engine.dispose()


def turn_rows(url: str, session_id: str) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(
                sa.select(turns).where(turns.c.session_id == session_id).order_by(turns.c.id)
            ).all()
    finally:
        engine.dispose()


def count(url: str, table: sa.Table, condition: Any) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(
                sa.select(sa.func.count()).select_from(table).where(condition)
            ).scalar_one()
    finally:
        engine.dispose()


TIMES = {"created_at", "updated_at", "latency_ms", "first_seen", "last_seen"}


def untimed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Id-free records without the clock readings (two sessions written moments apart)."""
    return [{k: v for k, v in r.items() if k not in TIMES} for r in canonical(records)]


def test_forget_erases_the_entity_and_keeps_the_turns(own_sessions):
    populated, suffix = own_sessions
    acme, globex = "acme" + suffix, "globex" + suffix
    sarah = entity_row(populated, acme, "Sarah Chen")
    assert sarah is not None
    assert "entity_overview" in session_rows(populated, acme)

    receipt = json_of(
        invoke(populated, "forget", "--yes", "sarah chen", "--session", acme, "--json")
    )

    assert receipt == {
        "entity": "Sarah Chen",
        "entities": 1,
        "contexts": 3,
        "turns_deleted": 0,
        "turns_updated": 3,
    }
    assert entity_row(populated, acme, "Sarah Chen") is None
    assert count(populated, contexts, contexts.c.entity_id == sarah.id) == 0
    remaining = turn_rows(populated, acme)
    assert len(remaining) == 6
    assert [row.entity_names for row in remaining] == [
        ["Acme Corp"],
        ["Berlin"],
        [],
        ["Acme Corp"],
        [],
        ["Acme Corp"],
    ]
    for name, rows in session_rows(populated, acme).items():
        for row in rows:
            for column in ("name", "name_key"):
                if column in row:
                    assert key(row[column]) != "sarah chen", (name, row)
            for listed in row.get("entity_names") or []:
                assert key(listed) != "sarah chen", (name, row)

    # the other session's Sarah Chen is a different entity and stays
    other = json_of(invoke(populated, "entity", "Sarah Chen", "--session", globex, "--json"))
    assert other["contexts_count"] == 1
    line = one_line_error(invoke(populated, "entity", "Sarah Chen", "--session", acme))
    assert "Sarah Chen" in line
    # forgetting twice: there is nothing left to forget
    line = one_line_error(invoke(populated, "forget", "--yes", "Sarah Chen", "--session", acme))
    assert "no entity" in line


def test_forget_with_turns_leaves_no_mention_of_the_name(own_sessions):
    populated, suffix = own_sessions
    acme, globex = "acme" + suffix, "globex" + suffix
    doomed = [row.id for row in turn_rows(populated, acme)[:3]]

    result = succeeded(
        invoke(populated, "forget", "--yes", "SARAH CHEN", "--session", acme, "--with-turns")
    )

    assert result.stdout.strip() == (
        "forgot 'Sarah Chen': 2 entities, 5 snippets, 3 turns deleted, 0 turns updated"
    )
    rows = session_rows(populated, acme)
    assert {"turns", "entities", "contexts", "extractions", "entity_overview"} <= set(rows)
    for name, table_rows in rows.items():
        for row in table_rows:
            assert "sarah chen" not in str(row).casefold(), (name, row)
    assert count(populated, turns, turns.c.id.in_(doomed)) == 0
    assert count(populated, extractions, extractions.c.turn_id.in_(doomed)) == 0
    assert count(populated, contexts, contexts.c.turn_id.in_(doomed)) == 0
    assert len(rows["turns"]) == 3
    assert len(rows["extractions"]) == 3
    stats = json_of(invoke(populated, "stats", "--session", acme, "--json"))
    assert (stats["message_count"], stats["entity_count"], stats["total_contexts"]) == (3, 1, 3)
    # the other session still mentions its own Sarah Chen
    assert "sarah chen" in str(session_rows(populated, globex)["turns"]).casefold()


@pytest.mark.fans_out
def test_forget_of_a_missing_entity_or_session_fails_in_one_line(shared_populated):
    before = json_of(invoke(shared_populated, "stats", "--json"))
    for name, session in (("Nobody", "acme"), ("Sarah Chen", "no-such-session")):
        line = one_line_error(
            invoke(shared_populated, "forget", "--yes", name, "--session", session)
        )
        assert repr(name) in line
        assert repr(session) in line
    assert json_of(invoke(shared_populated, "stats", "--json")) == before


def test_the_command_does_what_forget_entity_does(own_sessions):
    populated, suffix = own_sessions
    populate(url_maker(populated), suffix=suffix + "-py")
    receipts = []

    for session, name, with_turns in (("acme", "Acme Corp", True), ("globex", "globex", False)):
        by_command_session, by_python_session = session + suffix, session + suffix + "-py"
        options = ["--with-turns"] if with_turns else []
        by_command = json_of(
            invoke(
                populated,
                "forget",
                "--yes",
                name,
                "--session",
                by_command_session,
                *options,
                "--json",
            )
        )
        with url_maker(populated)(session_id=by_python_session) as memory:
            by_python = memory.forget_entity(name, with_turns=with_turns)
        assert by_command == by_python
        assert untimed(export_records(populated, by_command_session)) == untimed(
            export_records(populated, by_python_session)
        )
        receipts.append(by_command)

    # Acme Corp: turns 1, 4 and 6 go with their 2 + 1 + 1 snippets, and the note that
    # belonged to no turn goes too. Globex: its 2 snippets; its 2 turns only lose the name.
    assert receipts == [
        {
            "entity": "Acme Corp",
            "entities": 1,
            "contexts": 5,
            "turns_deleted": 3,
            "turns_updated": 0,
        },
        {"entity": "Globex", "entities": 1, "contexts": 2, "turns_deleted": 0, "turns_updated": 2},
    ]
