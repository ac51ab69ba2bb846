"""Revision 0009, the partial index of titled forms (``ix_entities_titled``): built from the
entities stored before it, so that each session's mark (``resolution_possible``) is right
from the first call after the upgrade; built ``CONCURRENTLY`` on Postgres by `db upgrade`,
and built again when an interrupted run left it invalid; gone after a downgrade."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.doubles import KeywordLLM
from tests.migrations.released import rows
from zerda_store import ConversationEntityMemory, Store, migrate
from zerda_store.identity.statements import resolution_possible

INDEX = "ix_entities_titled"
ON_POSTGRES = pytest.mark.parametrize(
    "empty_database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
NAMES = ["Dr. Sarah Chen", "Sarah Chen", "Robert Smith", "Bobby", "Mia Park"]


def _memory(store: Store, session_id: str) -> ConversationEntityMemory:
    return ConversationEntityMemory(KeywordLLM(NAMES), store=store, session_id=session_id)


def _three_sessions(store: Store) -> None:
    """A session with a titled form, one with an alias, one with neither."""
    for session_id, text in (
        ("titled", "Dr. Sarah Chen called"),
        ("aliased", "Robert Smith renewed"),
        ("plain", "Mia Park renewed"),
    ):
        _memory(store, session_id).save_context({"input": text}, {"output": "ok"})
    _memory(store, "aliased").add_alias("Robert Smith", "Bobby")


def _marks(store: Store) -> list[bool]:
    with store.connect() as connection:
        return [
            bool(connection.execute(sa.select(resolution_possible(session_id))).scalar())
            for session_id in ("titled", "aliased", "plain")
        ]


def _indexes(store: Store) -> list[str]:
    with store.connect() as connection:
        return sorted(
            index["name"] or "" for index in sa.inspect(connection).get_indexes("entities")
        )


def test_the_revision_indexes_the_titled_forms_stored_before_it(database_url: str) -> None:
    with Store(database_url) as store:
        _three_sessions(store)
        migrate.downgrade(store, "0008")
        assert INDEX not in _indexes(store)

        migrate.upgrade(store)

        assert INDEX in _indexes(store)
        migrate.check(store)
        assert _marks(store) == [True, True, False]
        info = _memory(store, "titled").load_memory_variables({"input": "Sarah Chen?"})
        assert info["entity_info"].startswith("Previous information about Dr. Sarah Chen:")
        if store.dialect == "sqlite":
            plan = rows(store, "EXPLAIN QUERY PLAN " + _mark_sql(store), session_id="titled")
            assert any(INDEX in str(step) for step in plan)


def _mark_sql(store: Store) -> str:
    compiled = sa.select(resolution_possible(sa.bindparam("session_id"))).compile(
        dialect=store.engine.dialect
    )
    return str(compiled).replace("?", ":session_id")


@ON_POSTGRES
def test_an_index_left_invalid_by_an_interrupted_upgrade_is_built_again(
    database_url: str,
) -> None:
    with Store(database_url) as store:
        _three_sessions(store)
        migrate.downgrade(store, "0008")
        # As a CREATE INDEX CONCURRENTLY that stopped before its end: an invalid index.
        with store.connect() as connection, connection.begin():
            connection.exec_driver_sql(f"CREATE INDEX {INDEX} ON entities (session_id)")
            connection.exec_driver_sql(
                f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{INDEX}'::regclass"
            )

        migrate.upgrade(store)

        assert rows(
            store,
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "WHERE i.indexrelid = to_regclass(:name)",
            name=INDEX,
        ) == [
            (
                True,
                f"CREATE INDEX {INDEX} ON public.entities USING btree (session_id) "
                "WHERE (name_key <> core_key)",
            )
        ]
        assert _marks(store) == [True, True, False]
        migrate.check(store)
