"""A rolling deploy on both backends: an application server of the released version
(commit ffd4cb9, revision 0004, installed into its own environment) keeps saving and
recalling through its open memory while `db upgrade` takes the schema to head under it;
once it has stopped, `db rekey` gives what it saved then the keys of the new version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import invoke, json_of
from tests.doubles import FixedLLM
from tests.migrations.released import released_database, rows
from tests.migrations.released_process import ReleasedServer
from zerda_store import ConversationEntityMemory, Store, migrate

pytestmark = pytest.mark.slow


@pytest.fixture
def server(empty_database_url: str, tmp_path: Path) -> Iterator[ReleasedServer]:
    with Store(empty_database_url) as store:
        released_database(store)
    server = ReleasedServer(empty_database_url, "crm", tmp_path)
    try:
        yield server
    finally:
        server.close()


def test_the_released_version_keeps_saving_and_recalling_after_db_upgrade(
    empty_database_url: str, server: ReleasedServer
) -> None:
    assert server.ask("save Sarah") == "saved"
    assert server.ask("save Müller") == "saved"

    with Store(empty_database_url) as store:
        migrate.upgrade(store)

    assert server.ask("save Sarah") == "saved"
    assert server.ask("save Zoë") == "saved"
    assert server.ask("load Sarah") == (
        "Previous information about Sarah:\nSarah called noted\nSarah called noted"
    )
    assert server.ask("entities") == ["Sarah", "Müller", "Zoë"]
    with Store(empty_database_url) as store:
        assert rows(store, "SELECT COUNT(*) FROM turns") == [(4,)]
        saved = "SELECT name, core_key FROM entities WHERE name = 'Zoë'"
        # Saved by the released version: no core (its key is fold-v1's) until re-keyed.
        assert rows(store, saved) == [("Zoë", "")]


def test_db_rekey_merges_what_the_released_version_saved_under_its_old_keys(
    empty_database_url: str, server: ReleasedServer
) -> None:
    server.ask("save Müller")
    server.ask("save Muller")  # one entity under fold-v2: the upgrade merges them
    with Store(empty_database_url) as store:
        migrate.upgrade(store)
    server.ask("save Müller")  # not found under its fold-v1 key: a second "Müller"
    server.ask("save Zoë")
    server.close()  # the last server of the released version stops: the contract step

    report = json_of(invoke(empty_database_url, "db", "rekey", "--json"))

    (crm,) = report["sessions"]
    assert (crm["session_id"], crm["key_rules"], crm["rekeyed"]) == ("crm", "fold-v2", 1)
    assert [(m["kept"], m["merged"]) for m in crm["merges"]] == [("Müller", "Müller")]
    assert json_of(invoke(empty_database_url, "db", "rekey", "--json")) == {"sessions": []}
    with (
        Store(empty_database_url) as store,
        ConversationEntityMemory.for_session(store, "crm", llm=FixedLLM("Zoe")) as memory,
    ):
        assert memory.list_entities() == ["Müller", "Zoë"]
        assert memory.get_entity_info("Mueller") is None
        assert memory.get_entity_info("Muller")["contexts_count"] == 3
        memory.save_context({"input": "Zoe"}, {"output": "ok"})
        assert memory.list_entities() == ["Müller", "Zoë"]
        memory.unmerge(crm["merges"][0]["merge_id"])
        assert memory.list_entities() == ["Müller", "Müller", "Zoë"]


def test_after_a_downgrade_the_released_version_finds_every_entity_again(
    empty_database_url: str, server: ReleasedServer, tmp_path: Path
) -> None:
    for name in ("Müller", "Muller", "Zoë"):
        server.ask(f"save {name}")
    with Store(empty_database_url) as store:
        migrate.upgrade(store)
        migrate.downgrade(store, "0004")
    server.close()

    restarted = ReleasedServer(empty_database_url, "crm", tmp_path)
    try:
        assert restarted.ask("save Muller") == "saved"
        assert restarted.ask("entities") == ["Müller", "Muller", "Zoë"]
        assert restarted.ask("load Muller") == (
            "Previous information about Muller:\nMuller called noted\nMuller called noted"
        )
    finally:
        restarted.close()


def test_db_contract_waits_for_db_rekey_and_then_the_released_version_cannot_save(
    empty_database_url: str, server: ReleasedServer
) -> None:
    server.ask("save Müller")
    with Store(empty_database_url) as store:
        migrate.upgrade(store)
    assert server.ask("save Zoë") == "saved"  # no core_key: the default gives it ''

    refused = invoke(empty_database_url, "db", "contract")
    assert refused.exit_code != 0
    assert "run `zerda-store db rekey` first" in refused.stderr
    assert server.ask("save Ada") == "saved"  # nothing was dropped

    json_of(invoke(empty_database_url, "db", "rekey", "--json"))
    contracted = json_of(invoke(empty_database_url, "db", "contract", "--json"))

    assert contracted == {"dropped_defaults": ["contexts.created_at", "entities.core_key"]}
    # A server of the previous release left running now fails to save, loudly, rather
    # than saving entities the new rules do not find; what it saved before stays found.
    answer = server.ask("save Bob")
    assert "IntegrityError" in answer["error"] and "core_key" in answer["error"]
    with (
        Store(empty_database_url) as store,
        ConversationEntityMemory.for_session(store, "crm", llm=FixedLLM("Zoe")) as memory,
    ):
        assert memory.list_entities() == ["Müller", "Zoë", "Ada"]
        assert memory.get_entity_info("Zoe")["contexts_count"] == 1
