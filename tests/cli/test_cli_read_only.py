"""Reading commands never create, migrate or change a database: another application's SQLite
file keeps its bytes and its journal mode, a mistyped path creates nothing, and an empty or
foreign database is named as such in one line. ``--read-only`` refuses the commands that
would write. (A database in a folder this process cannot write to:
tests/reliability/test_read_only_folder.py.)"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import citus
from tests.cli.helpers import invoke, json_of, one_line_error, succeeded


def reading_commands(tmp_path: Path) -> list[list[str]]:
    return [
        ["sessions"],
        ["sessions", "--json"],
        ["entities", "--session", "s"],
        ["entity", "Ada", "--session", "s"],
        ["stats"],
        ["stats", "--session", "s", "--json"],
        ["export", "--session", "s", "-o", "-"],
        ["db", "current"],
        ["db", "check"],
        ["copy", "--to", f"sqlite:///{tmp_path / 'copy-target.db'}"],
    ]


def sqlite_path(url: str) -> Path:
    return Path(str(sa.make_url(url).database))


def fingerprint(path: Path) -> tuple[str, list[str]]:
    """The file's bytes (hashed) and what its folder holds."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(os.listdir(path.parent))


def table_names(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        return sorted(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def create_foreign_tables(url: str) -> None:
    """Another application's tables (SQLite keeps its default rollback journal)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
            connection.exec_driver_sql("CREATE TABLE tags (id INTEGER PRIMARY KEY, label TEXT)")
            connection.exec_driver_sql("INSERT INTO notes (id, body) VALUES (1, 'keep me')")
    finally:
        engine.dispose()


def journal_mode(path: Path) -> str:
    plain = sqlite3.connect(path)
    try:
        return str(plain.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        plain.close()


# -- another application's database, an empty one, a mistyped path ------------------------


def test_reading_commands_leave_another_applications_database_alone(empty_database_url, tmp_path):
    url = empty_database_url
    create_foreign_tables(url)
    sqlite = url.startswith("sqlite")
    before = fingerprint(sqlite_path(url)) if sqlite else None

    for command in reading_commands(tmp_path):
        line = one_line_error(invoke(url, *command))
        assert "is not a zerda_store database (it has tables notes, tags)" in line, command

    assert table_names(url) == ["notes", "tags"]
    assert not (tmp_path / "copy-target.db").exists()
    if sqlite:
        assert fingerprint(sqlite_path(url)) == before  # no -wal/-shm left, not a byte changed
        assert journal_mode(sqlite_path(url)) == "delete"


def test_reading_commands_on_an_empty_database_say_it_is_empty(empty_database_url, tmp_path):
    url = empty_database_url
    if url.startswith("sqlite"):
        sqlite_path(url).touch()  # an empty file is an empty SQLite database
    for command in reading_commands(tmp_path):
        if command[:2] == ["db", "current"]:  # no revision, as `alembic current`: exit 0
            assert "an empty database" in succeeded(invoke(url, *command)).stdout
            continue
        line = one_line_error(invoke(url, *command))
        assert "is not a zerda_store database (it is empty)" in line, command
        assert "zerda-store --database-url " in line and "db upgrade`" in line
    assert table_names(url) == []
    if url.startswith("sqlite"):
        assert sqlite_path(url).stat().st_size == 0


def test_a_mistyped_sqlite_path_is_one_line_and_creates_nothing(tmp_path):
    mistyped = tmp_path / "memroy.db"
    for command in reading_commands(tmp_path):
        line = one_line_error(invoke(f"sqlite:///{mistyped}", *command))
        assert line == f"Error: no database file at {mistyped}", command
    assert os.listdir(tmp_path) == []


# On Citus the old schema is the lowest a distributed database can go down to.
OLD = citus.LOWEST_REVISION if citus.CITUS_URL else "0003"


@pytest.mark.fans_out
def test_reading_commands_do_not_migrate_an_old_zerda_store_database(database_url, tmp_path):
    url = database_url
    succeeded(invoke(url, "db", "downgrade", OLD, "--yes"))
    for command in reading_commands(tmp_path):
        if command[:2] == ["db", "current"]:
            assert succeeded(invoke(url, *command)).stdout.startswith(f"{OLD} (head is ")
            continue
        if command[:2] == ["db", "check"]:
            assert "not up to date" in one_line_error(invoke(url, *command))
            continue
        line = one_line_error(invoke(url, *command))
        assert OLD in line and "zerda-store --database-url " in line and "db upgrade`" in line, (
            command
        )
    assert succeeded(invoke(url, "db", "current")).stdout.startswith(f"{OLD} (head is ")


# -- --read-only -------------------------------------------------------------------------


@pytest.mark.fans_out
def test_read_only_refuses_commands_that_write_and_changes_nothing(populated, tmp_path):
    url = populated
    before = json_of(invoke(url, "stats", "--json"))
    export = tmp_path / "acme.jsonl"
    succeeded(invoke(url, "export", "--session", "acme", "-o", str(export)))

    for command in (
        ["forget", "--yes", "Sarah Chen", "--session", "acme"],
        ["import", str(export), "--session", "acme-again"],
        ["reextract", "--failed"],
        ["db", "downgrade", "base"],
        ["db", "upgrade"],
        ["demo"],
    ):
        line = one_line_error(invoke(url, "--read-only", *command))
        assert "read-only" in line, command

    assert json_of(invoke(url, "--read-only", "stats", "--json")) == before
    assert json_of(invoke(url, "stats", "--json")) == before


def test_read_only_upgrade_of_an_empty_database_creates_nothing(empty_database_url):
    url = empty_database_url
    one_line_error(invoke(url, "--read-only", "db", "upgrade"))
    if url.startswith("sqlite"):
        assert not sqlite_path(url).exists()
    else:
        assert table_names(url) == []
