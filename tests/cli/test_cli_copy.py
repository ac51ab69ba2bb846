"""`copy --to URL [--session S]`: SQLite to Postgres (and back) gives equal sessions, and a
second run copies nothing and duplicates nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.cli.helpers import (
    SESSIONS,
    api_view,
    canonical,
    export_records,
    invoke,
    json_of,
    one_line_error,
    populate,
    succeeded,
    url_maker,
)
from tests.doubles import new_postgres_database

TABLES = ("turns", "entities", "contexts", "extractions")


def row_counts(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                table: connection.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar_one()
                for table in TABLES
            }
    finally:
        engine.dispose()


def assert_same_sessions(source: str, target: str, sessions=SESSIONS) -> None:
    for session_id in sessions:
        assert canonical(export_records(target, session_id)) == canonical(
            export_records(source, session_id)
        ), session_id
        assert api_view(target, session_id) == api_view(source, session_id), session_id


def copy(source: str, target: str, *extra: str):
    return invoke(source, "copy", "--to", target, *extra)


@pytest.fixture
def sqlite_source(sqlite_url) -> str:
    populate(url_maker(sqlite_url))
    return sqlite_url


@pytest.mark.postgres
def test_copy_one_session_then_the_rest_then_nothing(sqlite_source, postgres_url):
    one = succeeded(copy(sqlite_source, postgres_url, "--session", "globex"))

    assert one.stdout.strip() == "copied 1 session, skipped 0 already present"
    assert [r["session_id"] for r in json_of(invoke(postgres_url, "sessions", "--json"))] == [
        "globex"
    ]
    assert_same_sessions(sqlite_source, postgres_url, ["globex"])
    again = succeeded(copy(sqlite_source, postgres_url, "--session", "globex"))
    assert again.stdout.strip() == "copied 0 sessions, skipped 1 already present"

    rest = succeeded(copy(sqlite_source, postgres_url))

    assert rest.stdout.strip() == "copied 2 sessions, skipped 1 already present"
    assert json_of(invoke(postgres_url, "sessions", "--json")) == json_of(
        invoke(sqlite_source, "sessions", "--json")
    )
    assert_same_sessions(sqlite_source, postgres_url)
    counts = row_counts(postgres_url)
    assert counts == row_counts(sqlite_source)
    assert counts == {"turns": 10, "entities": 7, "contexts": 14, "extractions": 10}

    nothing = succeeded(copy(sqlite_source, postgres_url))
    assert nothing.stdout.strip() == "copied 0 sessions, skipped 3 already present"
    assert row_counts(postgres_url) == counts
    assert_same_sessions(sqlite_source, postgres_url)


@pytest.mark.postgres
def test_copy_from_postgres_to_a_new_sqlite_file(postgres_url, tmp_path):
    populate(url_maker(postgres_url))
    target = f"sqlite:///{tmp_path / 'copy.db'}"

    assert succeeded(copy(postgres_url, target)).stdout.strip() == (
        "copied 3 sessions, skipped 0 already present"
    )
    assert_same_sessions(postgres_url, target)
    assert row_counts(target) == row_counts(postgres_url)


def test_copy_of_a_missing_session_fails_in_one_line(sqlite_source, tmp_path):
    target = f"sqlite:///{tmp_path / 'target.db'}"
    line = one_line_error(copy(sqlite_source, target, "--session", "ghost"))
    assert "ghost" in line
    assert not (tmp_path / "target.db").exists()


def test_copy_into_an_empty_database_creates_the_schema_there(empty_database_url, tmp_path):
    source = f"sqlite:///{tmp_path / 'source.db'}"
    populate(url_maker(source))

    result = succeeded(copy(source, empty_database_url))

    assert result.stdout.strip().startswith("copied 3 sessions")
    assert_same_sessions(source, empty_database_url)
    revision = succeeded(invoke(empty_database_url, "db", "current")).stdout
    assert "(head)" in revision


@pytest.mark.postgres
def test_copy_into_another_applications_postgres_database_names_the_target_to_upgrade(
    sqlite_source, postgres_admin
):
    target, drop = new_postgres_database(postgres_admin)
    engine = sa.create_engine(target)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE invoices (id integer)")
        line = one_line_error(copy(sqlite_source, target))
        shown = sa.make_url(target).render_as_string(hide_password=True)
        assert f"--database-url {shown}" in line.replace("'", "")
        assert "db upgrade" in line
        assert sqlite_source not in line
        assert sa.inspect(engine).get_table_names() == ["invoices"]
    finally:
        engine.dispose()
        drop()


def test_copy_to_an_unreachable_database_fails_without_the_password(sqlite_source):
    result = copy(sqlite_source, "postgresql://u:secret@127.0.0.1:1/x")
    line = one_line_error(result)
    assert "cannot connect" in line
    assert "secret" not in result.output


def test_copy_prints_a_json_receipt(sqlite_source, tmp_path):
    target = f"sqlite:///{tmp_path / 'target.db'}"

    first = json_of(copy(sqlite_source, target, "--json"))
    again = json_of(copy(sqlite_source, target, "--json"))

    assert first == {"copied": 3, "skipped": 0, "default_rules": 0, "session_rules": 0}
    assert again == {"copied": 0, "skipped": 3, "default_rules": 0, "session_rules": 0}
