"""An online revision 0006 stopped partway (some sessions re-keyed, merged and committed,
the database still at 0005), on both backends: a downgrade refuses, changing nothing, until
`db upgrade` finishes it; `db upgrade` prints the merges committed before it failed; and
(Postgres) a session whose re-keying a save of the previous release raced is re-keyed
again."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, one_line_error
from tests.migrations.released import released_database, rows, save_turns
from zerda_store import SchemaNotCurrentError, Store, migrate
from zerda_store.db.migration import sqlite_online
from zerda_store.errors import DatabaseError

SESSIONS = {"a": [["Müller"], ["Muller"]], "b": [["Zoë"], ["Zoe"]]}
FROZEN_REKEYING = "zerda_store_frozen_migrations.rekeying"
REFUSAL = "revision 0006 was interrupted: run `zerda-store db upgrade` to finish it, then downgrade"
STATE = (
    "SELECT id, session_id, name_key, core_key, name FROM entities ORDER BY id",
    "SELECT id, session_id, kept_entity_id, merged_entity_id FROM entity_merges ORDER BY id",
)


@pytest.fixture
def store_at_0005(empty_database_url: str) -> Iterator[tuple[Store, str]]:
    with Store(empty_database_url) as store:
        released_database(store)
        for session_id, turns in SESSIONS.items():
            save_turns(store, session_id, turns)
        migrate.upgrade(store, "0006")  # loads 0006's frozen modules
        migrate.downgrade(store, "0005")
        yield store, empty_database_url


def _stop_at_b(monkeypatch: pytest.MonkeyPatch) -> None:
    module = sys.modules[FROZEN_REKEYING]
    original = module.rekey_session

    def rekey_session(connection: sa.Connection, session_id: str, *args: Any, **kw: Any) -> Any:
        if session_id == "b":
            raise DatabaseError("the database went away")
        return original(connection, session_id, *args, **kw)

    monkeypatch.setattr(module, "rekey_session", rekey_session)


def _state(store: Store) -> list[list[tuple[Any, ...]]]:
    return [rows(store, query) for query in STATE]


def test_a_downgrade_after_an_interrupted_0006_refuses_until_the_upgrade_finishes(
    store_at_0005: tuple[Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, url = store_at_0005
    _stop_at_b(monkeypatch)
    with pytest.raises(DatabaseError):
        migrate.upgrade(store)
    monkeypatch.undo()
    assert migrate.current_revision(store) == "0005"
    before = _state(store)
    assert len(before[1]) == 1  # session a's merge is committed

    with pytest.raises(SchemaNotCurrentError, match=REFUSAL):
        migrate.downgrade(store, "0004")
    assert one_line_error(invoke(url, "db", "downgrade", "0004", "--yes")) == f"Error: {REFUSAL}"

    assert migrate.current_revision(store) == "0005"
    assert _state(store) == before
    migrate.upgrade(store)
    migrate.downgrade(store, "0004")
    assert migrate.current_revision(store) == "0004"
    assert not sa.inspect(store.engine).has_table("entity_aliases")


@pytest.mark.parametrize("as_json", [False, True])
def test_a_failed_db_upgrade_prints_the_merges_it_committed(
    store_at_0005: tuple[Store, str], monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    _, url = store_at_0005
    _stop_at_b(monkeypatch)

    result = invoke(url, "db", "upgrade", *(["--json"] if as_json else []))

    assert result.exit_code != 0
    assert "the database went away" in result.stderr
    undo = "zerda-store unmerge 1 --session a"
    if as_json:
        report = json.loads(result.stdout)
        assert report["interrupted"] is True
        assert [s["session_id"] for s in report["sessions"]] == ["a"]
        assert report["sessions"][0]["merges"][0]["undo"] == undo
    else:
        assert result.stdout.splitlines()[0] == (
            f"session 'a': merged 'Muller' into 'Müller' (merge 1, one key under fold-v2); "
            f"undo with: {undo}"
        )


def test_a_db_upgrade_on_sqlite_failing_after_the_merging_revision_keeps_it_and_its_report(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each revision is committed on its own (the re-keying session by session): a later
    revision's failure leaves 0006 done, and its merges printed with their undo commands."""
    with Store(sqlite_url) as store:
        released_database(store)
        for session_id, turns in SESSIONS.items():
            save_turns(store, session_id, turns)
    original = sqlite_online.rebuild_table

    def rebuild_table(bind: sa.Connection, table: str, *args: Any, **kw: Any) -> None:
        if table == "turns":  # revision 0007's first
            raise DatabaseError("the database went away")
        original(bind, table, *args, **kw)

    monkeypatch.setattr(sqlite_online, "rebuild_table", rebuild_table)

    result = invoke(sqlite_url, "db", "upgrade")

    assert result.exit_code != 0
    printed = [line for line in result.stdout.splitlines() if "undo with: " in line]
    assert [line.rsplit("undo with: ", 1)[1] for line in printed] == [
        "zerda-store unmerge 1 --session a",
        "zerda-store unmerge 2 --session b",
    ]
    with Store(sqlite_url) as store:
        assert migrate.current_revision(store) == "0006"
        assert rows(store, "SELECT COUNT(*) FROM entities") == [(2,)]


# SQLite has one writer at a time: no save commits inside a session's re-keying there.
@pytest.mark.parametrize(
    "empty_database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_previous_release_save_racing_a_sessions_rekeying_makes_it_run_again(
    store_at_0005: tuple[Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = store_at_0005
    save_turns(store, "z", [["Renée"]])
    module = sys.modules[FROZEN_REKEYING]
    original = module.set_keys
    raced: list[str] = []

    def set_keys(connection: sa.Connection, keys: list[tuple[int, str, str]]) -> None:
        if not raced and any(key == "renee" for _, key, _ in keys):
            # Between the re-keying's reads and its update, a server of the previous
            # release (which takes no session lock) commits the key "renee" of "Renee".
            raced.append("z")
            save_turns(store, "z", [["Renee"]])
        original(connection, keys)

    monkeypatch.setattr(module, "set_keys", set_keys)

    report = migrate.upgrade(store)

    assert raced == ["z"]
    z = next(entry for entry in report if entry["session_id"] == "z")
    assert [(m["kept"], m["merged"]) for m in z["merges"]] == [("Renée", "Renee")]
    assert rows(store, "SELECT name, name_key FROM entities WHERE session_id = 'z'") == [
        ("Renée", "renee")
    ]
    assert migrate.current_revision(store) == migrate.head_revision()
