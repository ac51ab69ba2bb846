"""Where a memory finds its database: the URL given, else the environment variable,
else the SQLite file in the working folder; a store and a URL together are refused."""

from __future__ import annotations

import pytest

from tests.doubles import FixedLLM, say
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.connections.urls import DATABASE_URL_ENV


def test_without_a_database_url_the_environment_variable_is_used(
    database_url, monkeypatch, tmp_path
):
    monkeypatch.setenv(DATABASE_URL_ENV, database_url)
    monkeypatch.chdir(tmp_path)

    with ConversationEntityMemory(FixedLLM("Sarah"), session_id="env") as memory:
        say(memory, "Sarah joined")

    assert not (tmp_path / "zerda_store.db").exists()
    monkeypatch.delenv(DATABASE_URL_ENV)
    with ConversationEntityMemory(database_url=database_url, session_id="env") as reopened:
        assert reopened.list_entities() == ["Sarah"]
        assert [turn["input"] for turn in reopened.chat_memory] == ["Sarah joined"]


def test_without_url_or_environment_the_sqlite_file_in_the_working_folder_is_used(
    monkeypatch, tmp_path
):
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    monkeypatch.chdir(tmp_path)

    with ConversationEntityMemory(FixedLLM("Sarah")) as memory:
        assert memory.store.url.get_backend_name() == "sqlite"
        say(memory, "Sarah joined")

    assert (tmp_path / "zerda_store.db").is_file()
    with ConversationEntityMemory(
        database_url=f"sqlite:///{tmp_path / 'zerda_store.db'}"
    ) as reopened:
        assert reopened.list_entities() == ["Sarah"]


def test_a_store_and_a_database_url_together_are_a_value_error(database_url):
    with Store(database_url) as store:
        with pytest.raises(ValueError, match="either database_url or store"):
            ConversationEntityMemory(store=store, database_url=database_url)
        assert not store.closed


def test_a_version_record_set_back_by_hand_is_one_clear_error(sqlite_url):
    """The fourth hardening round, G8: the SQLite API upgrading a database whose version
    record was set back by hand met its own tables, and raised SQLAlchemy's raw error."""
    import sqlite3

    from zerda_store import ConversationEntityMemory, Store, migrate
    from zerda_store.errors import SchemaNotCurrentError

    with Store(sqlite_url) as store:
        migrate.upgrade(store)
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0004'")

    with pytest.raises(SchemaNotCurrentError, match="records revision 0004, but holds what a"):
        ConversationEntityMemory(database_url=sqlite_url)

    with Store(sqlite_url) as store:
        assert migrate.current_revision(store) == "0004"  # nothing was changed
