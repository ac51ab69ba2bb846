"""The merge report of `db upgrade` survives an interruption, on both backends: it comes
from the merge log (every merge of the key rules that no finished run reported), so the
rerun after a run stopped before printing prints every merge of the upgrade with its undo
command, text and JSON; a finished run's merges are not printed again; `merges --reason`
lists them across sessions."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of, succeeded
from tests.doubles import new_postgres_database
from tests.migrations.released import released_database, save_turns
from zerda_store import Store, migrate
from zerda_store.db.migration import merge_report
from zerda_store.errors import DatabaseError

SESSIONS = {"a": [["Müller"], ["Muller"]], "b": [["Zoë"], ["Zoe"]], "c": [["Ada"]]}
MERGES = [
    ("a", "Müller", "Muller", "zerda-store unmerge 1 --session a"),
    ("b", "Zoë", "Zoe", "zerda-store unmerge 2 --session b"),
]
FROZEN_REKEYING = "zerda_store_frozen_migrations.rekeying"


def _released(url: str) -> None:
    with Store(url) as store:
        released_database(store)
        for session_id, turns in SESSIONS.items():
            save_turns(store, session_id, turns)


def _printed(report: dict[str, Any]) -> list[tuple[str, str, str, str | None]]:
    return [
        (entry["session_id"], m["kept"], m["merged"], m["undo"])
        for entry in report["sessions"]
        for m in entry["merges"]
    ]


def test_a_run_stopped_after_the_merging_revision_leaves_its_merges_to_the_rerun(
    empty_database_url: str,
) -> None:
    _released(empty_database_url)
    with Store(empty_database_url) as store:
        # As a run killed after revision 0006 committed, before anything was printed.
        migrate.upgrade(store, "0010")

    rerun = json_of(invoke(empty_database_url, "db", "upgrade", "--json"))

    assert _printed(rerun) == MERGES
    a, _ = rerun["sessions"]
    assert (a["key_rules"], a["rekeyed"]) == ("fold-v2", None)  # counted by the stopped run
    assert json_of(invoke(empty_database_url, "db", "upgrade", "--json"))["sessions"] == []
    again = succeeded(invoke(empty_database_url, "db", "upgrade"))
    assert "unmerge" not in again.stdout


def test_the_rerun_prints_each_merge_with_its_undo_command_and_one_undone_since(
    empty_database_url: str,
) -> None:
    _released(empty_database_url)
    with Store(empty_database_url) as store:
        migrate.upgrade(store, acknowledge=False)  # done, but stopped before printing
    succeeded(invoke(empty_database_url, "unmerge", "2", "--session", "b"))

    rerun = succeeded(invoke(empty_database_url, "db", "upgrade"))

    assert rerun.stdout.splitlines()[:3] == [
        "nothing to apply: the database was at that revision already",
        "session 'a': merged 'Muller' into 'Müller' (merge 1, one key under fold-v2); "
        "undo with: zerda-store unmerge 1 --session a",
        "session 'b': merged 'Zoe' into 'Zoë' (merge 2, one key under fold-v2); undone since",
    ]


@pytest.mark.fans_out
def test_merges_lists_the_key_rules_merges_of_every_session(empty_database_url: str) -> None:
    _released(empty_database_url)
    with Store(empty_database_url) as store:
        migrate.upgrade(store)

    listed = json_of(invoke(empty_database_url, "merges", "--reason", "key rules", "--json"))

    assert [(m["session_id"], m["kept"], m["merged"], m["undo"]) for m in listed] == MERGES
    table = succeeded(invoke(empty_database_url, "merges", "--reason", "key rules"))
    assert "zerda-store unmerge 2 --session b" in table.stdout
    assert json_of(invoke(empty_database_url, "merges", "--reason", "manual", "--json")) == []
    refused = invoke(empty_database_url, "merges")
    assert refused.exit_code == 2 and "--reason" in refused.stderr


@pytest.fixture
def postgres_released(postgres_admin: sa.Engine) -> Iterator[str]:
    url, drop = new_postgres_database(postgres_admin)
    try:
        _released(url)
        with Store(url) as store:
            migrate.upgrade(store, "0006")  # loads 0006's frozen modules
            migrate.downgrade(store, "0005")
        yield url
    finally:
        drop()


@pytest.mark.postgres
@pytest.mark.parametrize("as_json", [False, True])
def test_the_rerun_after_a_run_stopped_inside_revision_0006_prints_every_merge(
    postgres_released: str, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    module = sys.modules[FROZEN_REKEYING]
    original = module.rekey_session

    def rekey_session(connection: sa.Connection, session_id: str, *args: Any, **kw: Any) -> Any:
        if session_id == "b":
            raise DatabaseError("the deploy job was killed")
        return original(connection, session_id, *args, **kw)

    monkeypatch.setattr(module, "rekey_session", rekey_session)
    with Store(postgres_released) as store, pytest.raises(DatabaseError):
        migrate.upgrade(store)  # session a re-keyed and merged, committed; nothing printed
    monkeypatch.undo()

    rerun = succeeded(invoke(postgres_released, "db", "upgrade", *(["--json"] if as_json else [])))

    if as_json:
        assert _printed(json.loads(rerun.stdout)) == MERGES
    else:
        printed = [line for line in rerun.stdout.splitlines() if "undo with:" in line]
        assert [line.rsplit("undo with: ", 1)[1] for line in printed] == [m[3] for m in MERGES]


def test_a_report_not_marked_as_printed_is_printed_again_and_the_upgrade_succeeds(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _released(empty_database_url)
    original, calls = merge_report._has_log, []

    def gone_when_marking(connection: sa.Connection) -> bool:
        calls.append(1)
        if len(calls) == 2:  # the report was read and printed; now it is marked
            raise sa.exc.OperationalError("UPDATE", {}, Exception("the server went away"))
        return original(connection)

    monkeypatch.setattr(merge_report, "_has_log", gone_when_marking)
    first = json_of(invoke(empty_database_url, "db", "upgrade", "--json"))
    monkeypatch.undo()

    assert _printed(first) == MERGES
    assert _printed(json_of(invoke(empty_database_url, "db", "upgrade", "--json"))) == MERGES
    assert json_of(invoke(empty_database_url, "db", "upgrade", "--json"))["sessions"] == []
