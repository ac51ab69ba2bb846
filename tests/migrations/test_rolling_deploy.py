"""A rolling deploy on both backends: an application server of the released version
(commit ffd4cb9, revision 0004, installed into its own environment) keeps saving and
recalling through its open memory while `db upgrade` takes the schema to head under it,
and what it saved then is there for the new version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.migrations.released import released_database, rows
from tests.migrations.released_process import ReleasedServer
from zerda_store import Store, migrate

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
