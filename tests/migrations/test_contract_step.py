"""`zerda-store db contract`, on both backends: the defaults kept for servers of the
previous release are dropped once `db rekey` has given what they saved the new keys, and
not before; the schema stays current and the new release saves and recalls as before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of
from tests.doubles import FixedLLM
from tests.migrations.released import released_database, rows, save_turns
from zerda_store import (
    ConversationEntityMemory,
    LockTimeoutError,
    SchemaNotCurrentError,
    Store,
    migrate,
)
from zerda_store.db.migration import lock_waits

DEFAULTS = ["contexts.created_at", "entities.core_key"]


@pytest.fixture
def store(empty_database_url: str) -> Iterator[Store]:
    with Store(empty_database_url) as store:
        released_database(store)
        save_turns(store, "crm", [["Müller"], ["Muller"]])
        migrate.upgrade(store)
        yield store


def _defaults(store: Store) -> list[str]:
    inspector = sa.inspect(store.engine)
    return [
        f"{table}.{column['name']}"
        for table in ("contexts", "entities")
        for column in inspector.get_columns(table)
        if column.get("default") is not None and f"{table}.{column['name']}" in DEFAULTS
    ]


def test_db_contract_waits_for_db_rekey_then_drops_the_defaults_of_the_previous_release(
    store: Store, empty_database_url: str
) -> None:
    save_turns(store, "crm", [["Zoë"]])  # a server of the previous release, after the upgrade

    refused = invoke(empty_database_url, "db", "contract")

    assert refused.exit_code != 0
    assert "1 entities of 1 sessions, saved by servers of the previous release" in refused.stderr
    assert "run `zerda-store db rekey` first" in refused.stderr
    assert _defaults(store) == DEFAULTS

    json_of(invoke(empty_database_url, "db", "rekey", "--json"))
    assert json_of(invoke(empty_database_url, "db", "contract", "--json")) == {
        "dropped_defaults": DEFAULTS
    }

    assert _defaults(store) == []
    migrate.check(store)
    with pytest.raises(sa.exc.IntegrityError):  # what the previous release's save would do
        save_turns(store, "crm", [["Ada"]])
    with ConversationEntityMemory.for_session(store, "crm", llm=FixedLLM("Ada, Zoe")) as memory:
        memory.save_context({"input": "Ada met Zoe"}, {"output": "ok"})
        assert memory.list_entities() == ["Müller", "Zoë", "Ada"]
        assert memory.get_entity_info("Zoe")["contexts_count"] == 2
    assert rows(store, "SELECT COUNT(*) FROM entities WHERE core_key = ''") == [(0,)]
    again = invoke(empty_database_url, "db", "contract")
    assert again.stdout == "nothing to contract: no default of the previous release is left\n"


def test_db_contract_is_refused_before_the_upgrade_reached_head(empty_database_url: str) -> None:
    with Store(empty_database_url) as store:
        released_database(store)
        migrate.upgrade(store, "0006")

        with pytest.raises(SchemaNotCurrentError, match=r"at revision 0006, not .*db upgrade"):
            migrate.contract(store)

        assert _defaults(store) == DEFAULTS


def test_db_contract_on_sqlite_keeps_the_ids_of_deleted_rows_from_being_reused(
    store: Store,
) -> None:
    if store.dialect != "sqlite":
        pytest.skip("Postgres sequences are not touched by dropping a default")
    entity_id = "SELECT id FROM entities WHERE name = :name"
    with ConversationEntityMemory.for_session(store, "crm", llm=FixedLLM("Ada, Bob")) as memory:
        memory.save_context({"input": "Ada and Bob"}, {"output": "ok"})
        [(ada,)] = rows(store, entity_id, name="Ada")
        merged = memory.merge_entities("Bob", "Ada")  # the newest id, for unmerge to restore
    counters = "SELECT name, seq FROM sqlite_sequence WHERE name IN ('contexts', 'entities')"
    before = sorted(rows(store, counters))

    migrate.contract(store)

    assert sorted(rows(store, counters)) == before
    with ConversationEntityMemory.for_session(store, "crm", llm=FixedLLM("Carol")) as memory:
        memory.save_context({"input": "Carol"}, {"output": "ok"})
        assert rows(store, entity_id, name="Carol") == [(ada + 1,)]
        memory.unmerge(merged["merge_id"])
    assert rows(store, entity_id, name="Ada") == [(ada,)]


def test_db_contract_on_sqlite_copies_no_table(store: Store) -> None:
    """The defaults leave the tables' definitions alone (a copy of a table would hold the
    write lock, and the writers with it, while every row is copied): every table and index
    keeps its pages, and the rows, views and checks are as they were."""
    if store.dialect != "sqlite":
        pytest.skip("Postgres drops a default without touching a row either")
    pages = "SELECT type, name, rootpage FROM sqlite_master ORDER BY type, name"
    before = rows(store, pages)

    assert migrate.contract(store) == DEFAULTS

    assert rows(store, pages) == before
    assert _defaults(store) == []
    assert rows(store, "PRAGMA integrity_check") == [("ok",)]
    migrate.check(store)
    with ConversationEntityMemory.for_session(store, "crm", llm=FixedLLM("Muller")) as memory:
        memory.save_context({"input": "Muller"}, {"output": "ok"})
        assert memory.get_entity_info("Müller")["contexts_count"] == 3


def test_db_contract_gives_way_to_a_long_transaction_and_changes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    if store.dialect != "postgresql":
        pytest.skip("SQLite has no lock_timeout: its writers wait for one another")
    monkeypatch.setattr(lock_waits, "RETRY_PAUSES", (0.01,))
    with store.engine.connect() as holder, holder.begin():
        holder.exec_driver_sql("SELECT COUNT(*) FROM entities").scalar()  # as a long request

        with pytest.raises(LockTimeoutError, match="db contract: gave up after 2 tries"):
            migrate.contract(store)

        holder.rollback()
    assert _defaults(store) == DEFAULTS
    assert migrate.contract(store) == DEFAULTS
