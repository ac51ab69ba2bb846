"""Databases that are not zerda_store's, or whose zerda_store tables the connection does not
see: the errors say what was found (another application's Alembic history; zerda_store's
tables in another Postgres schema), nothing is created beside them, and ``schema=`` /
``--schema`` / the URL's search_path reach tables kept in a schema of their own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded
from tests.doubles import FixedLLM, new_postgres_database
from zerda_store import (
    ConversationEntityMemory,
    NotAStoreDatabaseError,
    SchemaNotCurrentError,
    Store,
    StoreError,
    migrate,
)

FOREIGN_REVISION = "a1b2c3d4e5f6"


def run(url: str, *statements: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def tables_by_schema(url: str) -> set[tuple[str | None, str]]:
    """Every table, with its schema on Postgres."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        if engine.dialect.name == "sqlite":
            return {(None, name) for name in inspector.get_table_names()}
        return {
            (schema, name)
            for schema in inspector.get_schema_names()
            if schema not in ("information_schema", "pg_catalog", "pg_toast")
            for name in inspector.get_table_names(schema=schema)
        }
    finally:
        engine.dispose()


# -- another application's Alembic-managed database -----------------------------------------


@pytest.fixture
def foreign_alembic_url(empty_database_url: str) -> str:
    run(
        empty_database_url,
        "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER)",
        "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
        f"INSERT INTO alembic_version (version_num) VALUES ('{FOREIGN_REVISION}')",
    )
    return empty_database_url


@pytest.mark.parametrize("auto_migrate", [None, True, False])
def test_another_applications_alembic_database_is_called_that(foreign_alembic_url, auto_migrate):
    before = tables_by_schema(foreign_alembic_url)
    with pytest.raises(NotAStoreDatabaseError) as caught:
        ConversationEntityMemory(database_url=foreign_alembic_url, auto_migrate=auto_migrate)

    message = str(caught.value)
    assert FOREIGN_REVISION in message
    assert "another application" in message
    assert "none of zerda_store's tables" in message
    assert "invoices" in message
    assert "newer version" not in message
    assert tables_by_schema(foreign_alembic_url) == before


def test_db_commands_on_another_applications_alembic_database_say_so_and_change_nothing(
    foreign_alembic_url,
):
    url = foreign_alembic_url
    before = tables_by_schema(url)
    for command in (
        ["db", "upgrade"],
        ["db", "current"],
        ["sessions"],
        ["forget", "--yes", "X", "--session", "s"],
    ):
        line = one_line_error(invoke(url, *command))
        assert "another application" in line, command
        assert FOREIGN_REVISION in line, command
    assert tables_by_schema(url) == before


def test_an_unknown_revision_beside_our_tables_still_points_at_a_newer_zerda_store(database_url):
    run(database_url, f"UPDATE alembic_version SET version_num = '{FOREIGN_REVISION}'")
    # Without the record of what can still run on it (as a schema before revision 0012;
    # with it, tests/migrations/test_compatibility_floor.py).
    run(database_url, "DROP TABLE compatibility_floor")
    with pytest.raises(SchemaNotCurrentError) as caught:
        ConversationEntityMemory(database_url=database_url)
    assert not isinstance(caught.value, NotAStoreDatabaseError)
    assert "newer version of zerda_store" in str(caught.value)


# -- Postgres: zerda_store's tables in a schema off the search_path ---------------------------


def with_search_path(url: str, schema: str) -> str:
    return f"{url}?options=-csearch_path%3D{schema}"


@pytest.fixture
def hidden_schema_url(postgres_admin: sa.Engine) -> Iterator[str]:
    """A Postgres database whose zerda_store tables (holding session "s1") are in schema
    zerda, while a plain connection's search_path is the default one ("$user", public)."""
    url, drop = new_postgres_database(postgres_admin)
    try:
        run(url, "CREATE SCHEMA zerda")
        in_zerda = with_search_path(url, "zerda")
        with Store(in_zerda) as store:
            migrate.upgrade(store)
        with ConversationEntityMemory(
            FixedLLM("Ada"), database_url=in_zerda, session_id="s1"
        ) as memory:
            memory.save_context({"input": "Ada called"}, {"output": "ok"})
        yield url
    finally:
        drop()


@pytest.mark.postgres
def test_a_search_path_that_hides_our_schema_is_named_in_the_error(hidden_schema_url):
    with pytest.raises(SchemaNotCurrentError) as caught:
        ConversationEntityMemory(database_url=hidden_schema_url)
    message = str(caught.value)
    assert "schema zerda has them" in message
    assert "public" in message  # the search_path that was used
    assert "empty" not in message

    line = one_line_error(invoke(hidden_schema_url, "sessions"))
    assert "schema zerda has them" in line
    assert "--schema zerda" in line


@pytest.mark.postgres
def test_db_upgrade_creates_no_second_set_of_tables_beside_a_hidden_schema(hidden_schema_url):
    before = tables_by_schema(hidden_schema_url)
    line = one_line_error(invoke(hidden_schema_url, "db", "upgrade"))
    assert "schema zerda has them" in line
    with pytest.raises(SchemaNotCurrentError, match="schema zerda has them"):
        ConversationEntityMemory(database_url=hidden_schema_url, auto_migrate=True)
    assert tables_by_schema(hidden_schema_url) == before
    assert not {name for schema, name in before if schema == "public"}


@pytest.mark.postgres
def test_the_schema_option_and_the_urls_search_path_reach_the_hidden_schema(hidden_schema_url):
    with (
        Store(hidden_schema_url, schema="zerda") as store,
        ConversationEntityMemory(FixedLLM("Ada"), store=store, session_id="s1") as memory,
    ):
        assert memory.list_entities() == ["Ada"]

    listed = json_of(invoke(hidden_schema_url, "--schema", "zerda", "sessions", "--json"))
    assert [row["session_id"] for row in listed] == ["s1"]
    in_zerda = with_search_path(hidden_schema_url, "zerda")
    listed = json_of(invoke(in_zerda, "sessions", "--json"))
    assert [row["session_id"] for row in listed] == ["s1"]
    assert succeeded(invoke(in_zerda, "db", "check")).stdout.strip() == "schema matches the code"


@pytest.mark.postgres
def test_an_explicit_schema_is_created_with_its_own_tables_by_db_upgrade(hidden_schema_url):
    url = hidden_schema_url
    before = tables_by_schema(url)
    succeeded(invoke(url, "--schema", "tenant2", "db", "upgrade"))

    created = tables_by_schema(url) - before
    assert {schema for schema, _ in created} == {"tenant2"}
    assert {name for _, name in created} >= {"alembic_version", "turns", "entities", "contexts"}
    assert json_of(invoke(url, "--schema", "tenant2", "sessions", "--json")) == []
    assert [
        r["session_id"] for r in json_of(invoke(url, "--schema", "zerda", "sessions", "--json"))
    ] == ["s1"]
    with Store(url, schema="tenant2") as store:
        assert migrate.current_revision(store) == migrate.head_revision()


@pytest.mark.postgres
def test_a_search_path_naming_no_existing_schema_is_explained_by_db_upgrade(postgres_admin):
    url, drop = new_postgres_database(postgres_admin)
    try:
        missing = f"nope_{uuid.uuid4().hex[:6]}"
        line = one_line_error(invoke(with_search_path(url, missing), "db", "upgrade"))
        assert "no schema on the search_path" in line
        assert missing in line
        assert tables_by_schema(url) == set()
    finally:
        drop()


@pytest.mark.parametrize("schema", ["Zerda", "a b", "x;drop", "", "1abc"])
def test_a_schema_must_be_a_plain_lower_case_identifier(schema):
    with pytest.raises(ValueError, match="schema must be"):
        Store("postgresql://u@127.0.0.1:1/x", schema=schema)


def test_a_sqlite_store_takes_no_schema(sqlite_url):
    with pytest.raises(StoreError, match="Postgres only"):
        Store(sqlite_url, schema="zerda")


@pytest.mark.postgres
def test_a_search_path_in_the_url_chooses_where_db_upgrade_creates_tables(hidden_schema_url):
    before = tables_by_schema(hidden_schema_url)
    run(hidden_schema_url, "CREATE SCHEMA tenant3")
    succeeded(invoke(with_search_path(hidden_schema_url, "tenant3"), "db", "upgrade"))

    created = tables_by_schema(hidden_schema_url) - before
    assert {schema for schema, _ in created} == {"tenant3"}
