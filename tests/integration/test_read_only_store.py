"""``Store(url, read_only=True)``: reads everything, writes nothing (a clear
``ReadOnlyStoreError`` before any model call), never creates or migrates a database, and
the database itself refuses writes on its connections. A database that refuses writes on
its own (a read-only SQLite URI, a Postgres session in read-only mode) gives the same error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import KeywordLLM
from zerda_store import (
    ConversationEntityMemory,
    DatabaseUnavailableError,
    ReadOnlyStoreError,
    SchemaNotCurrentError,
    Store,
    StoreError,
    migrate,
)
from zerda_store.db.store import core_of

NAMES = ("Sarah", "Omar")


def counts(url: str) -> tuple[int, int, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return tuple(  # type: ignore[return-value]
                connection.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar_one()
                for table in ("turns", "entities", "contexts")
            )
    finally:
        engine.dispose()


def saved(database_url: str) -> str:
    with ConversationEntityMemory(KeywordLLM(NAMES), database_url=database_url) as memory:
        memory.save_context({"input": "Sarah met Omar"}, {"output": "noted"})
        memory.save_context({"input": "Sarah wants a quote"}, {"output": "sure"})
    return database_url


def test_a_read_only_store_reads_what_was_saved(database_url):
    saved(database_url)
    with Store(database_url, read_only=True) as store:
        memory = ConversationEntityMemory(KeywordLLM(NAMES), store=store)
        assert memory.list_entities() == ["Sarah", "Omar"]
        recalled = memory.load_memory_variables({"input": "What about Sarah?"})["entity_info"]
        assert "Sarah wants a quote sure" in recalled
        assert len(memory.chat_memory) == 2
        assert memory.get_memory_stats()["total_contexts"] == 3
        assert memory.get_entity_info("Omar")["contexts_count"] == 1


WRITES: list[Callable[[ConversationEntityMemory], Any]] = [
    lambda memory: memory.save_context({"input": "Sarah again"}, {"output": "ok"}),
    lambda memory: memory.save_context(
        {"input": "Sarah again"}, {"output": "ok"}, idempotency_key="k1"
    ),
    lambda memory: memory.save_contexts([({"input": "Omar"}, {"output": "ok"})]),
    lambda memory: memory.entity_store["Sarah"].add_context("a note"),
    lambda memory: memory.forget_entity("Omar"),
    lambda memory: memory.clear(),
    lambda memory: memory.reextract(),
]


@pytest.mark.parametrize(
    "write",
    WRITES,
    ids=[
        "save_context",
        "save_context-keyed",
        "save_contexts",
        "add_context",
        "forget_entity",
        "clear",
        "reextract",
    ],
)
def test_writes_through_a_read_only_store_are_refused_before_any_model_call(database_url, write):
    saved(database_url)
    before = counts(database_url)
    llm = KeywordLLM(NAMES)
    with Store(database_url, read_only=True) as store:
        memory = ConversationEntityMemory(llm, store=store)
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            write(memory)
    assert llm.calls == 0
    assert counts(database_url) == before


def test_the_database_itself_refuses_writes_on_a_read_only_stores_connections(database_url):
    saved(database_url)
    before = counts(database_url)
    with (
        Store(database_url, read_only=True) as store,
        pytest.raises(sa.exc.DBAPIError, match=r"read.?only"),
        core_of(store).query() as connection,
    ):
        connection.exec_driver_sql("DELETE FROM contexts")
    assert counts(database_url) == before


def test_a_read_only_store_never_creates_a_database(empty_database_url):
    url = empty_database_url
    if url.startswith("sqlite"):
        path = Path(str(sa.make_url(url).database))
        with pytest.raises(DatabaseUnavailableError, match=f"no database file at {path}"):
            Store(url, read_only=True)
        assert not path.exists()
        return
    with Store(url, read_only=True) as store:
        with pytest.raises(SchemaNotCurrentError, match="it is empty"):
            ConversationEntityMemory(store=store, auto_migrate=True)
        assert migrate.current_revision(store) is None
    engine = sa.create_engine(url)
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_a_read_only_store_never_migrates_an_older_schema(database_url):
    with Store(database_url) as store:
        migrate.downgrade(store, "0003")
    with Store(database_url, read_only=True) as store:
        with pytest.raises(
            SchemaNotCurrentError, match=r"0003.*zerda-store --database-url .* db upgrade"
        ):
            ConversationEntityMemory(store=store, auto_migrate=True)
        assert migrate.current_revision(store) == "0003"


def test_a_read_only_store_cannot_be_upgraded_or_downgraded(database_url):
    with Store(database_url, read_only=True) as store:
        with pytest.raises(ReadOnlyStoreError):
            migrate.downgrade(store, "base")
        with pytest.raises(ReadOnlyStoreError):
            migrate.upgrade(store)
        assert migrate.current_revision(store) == migrate.head_revision()


def refusing_url(database_url: str) -> str:
    """The database's URL with the database itself refusing writes."""
    url = sa.make_url(database_url)
    if url.get_backend_name() == "sqlite":
        return f"sqlite:///file:{url.database}?mode=ro&uri=true"
    return url.update_query_dict(
        {"options": "-c default_transaction_read_only=on"}
    ).render_as_string(hide_password=False)


def test_a_database_that_refuses_writes_gives_a_read_only_store_error(database_url):
    saved(database_url)
    before = counts(database_url)
    with ConversationEntityMemory(
        KeywordLLM(NAMES), database_url=refusing_url(database_url)
    ) as memory:
        assert memory.list_entities() == ["Sarah", "Omar"]
        with pytest.raises(ReadOnlyStoreError, match="refuses writes") as caught:
            memory.save_context({"input": "Sarah again"}, {"output": "ok"})
        assert isinstance(caught.value, StoreError)
    assert counts(database_url) == before


@pytest.mark.parametrize(
    "empty_database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_read_only_postgres_store_runs_read_only_transactions(empty_database_url):
    with Store(empty_database_url, read_only=True) as store, store.connect() as connection:
        assert connection.exec_driver_sql("SHOW default_transaction_read_only").scalar() == "on"


def test_a_read_only_sqlite_store_takes_a_plain_path_not_a_uri(sqlite_url):
    path = sa.make_url(sqlite_url).database
    with pytest.raises(StoreError, match="plain sqlite:///PATH"):
        Store(f"sqlite:///file:{path}?mode=ro&uri=true", read_only=True)
