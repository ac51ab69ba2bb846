"""The command line's one-line errors never show a password given in the query or holding
"@" signs: with the URL from --database-url or from ZERDA_STORE_DATABASE_URL, and for the
destination of `copy --to` (Postgres; every form of ``tests.passwords.FORMS``)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

import zerda_store
from tests.cli.helpers import json_of, one_line_error, populate, succeeded, url_maker, usage_error
from tests.doubles import NamesExtractor
from tests.passwords import (
    WRONG,
    Form,
    RoleDatabase,
    leaks,
    lose_the_next_commit,
    table_locked,
    unusable_urls,
)
from zerda_store import ConversationEntityMemory, Store
from zerda_store.cli import main
from zerda_store.db.connections.urls import DATABASE_URL_ENV


@pytest.fixture(params=["flag", "env"])
def given(request: pytest.FixtureRequest) -> str:
    """How the URL is given: --database-url, or the environment variable."""
    return str(request.param)


def run(url: str, given: str, *args: str) -> Result:
    if given == "flag":
        runner, prefix = CliRunner(env={DATABASE_URL_ENV: None}), ["--database-url", url]
    else:
        runner, prefix = CliRunner(env={DATABASE_URL_ENV: url}), []
    return runner.invoke(main, [*prefix, *args])


def error_line(
    result: Result, form: Form, logs: pytest.LogCaptureFixture | None = None, *, usage: bool = False
) -> str:
    """The one error line (of a usage error, with ``usage``), after checking that nothing
    the command said or logged shows a piece of the password (or of the wrong one)."""
    line = usage_error(result) if usage else one_line_error(result)
    said = f"{result.output}\n{result.stderr}\n{result.exception!r}"
    assert leaks(said, form.password, WRONG) == set()
    if logs is not None:
        assert leaks(logs.text, form.password, WRONG) == set()
    return line


def masked(role: RoleDatabase) -> str:
    return f"postgresql+psycopg://{role.user}:***@{role.host}:{role.port}/{role.database}"


def test_an_unreachable_port(
    form: Form, given: str, refused_port: int, logs: pytest.LogCaptureFixture
) -> None:
    role = RoleDatabase("zerda", "127.0.0.1", refused_port, "zerda", form)
    line = error_line(run(role.url(), given, "sessions"), form, logs)
    assert f"cannot connect to {masked(role)}" in line
    assert "refused" in line


@pytest.mark.postgres
def test_a_wrong_password(
    form: Form,
    given: str,
    password_checked_database: RoleDatabase,
    logs: pytest.LogCaptureFixture,
) -> None:
    role = password_checked_database
    line = error_line(run(role.url(WRONG), given, "sessions"), form, logs)
    assert f"cannot connect to {masked(role)}" in line
    assert "password authentication failed" in line


@pytest.mark.postgres
def test_the_right_password_lists_the_sessions(
    form: Form, given: str, password_checked_database: RoleDatabase
) -> None:
    role = password_checked_database
    populate(url_maker(role.url()))
    sessions = json_of(run(role.url(), given, "sessions", "--json"))
    assert [session["session_id"] for session in sessions] == ["acme", "globex", "quiet"]


def test_an_unusable_url(form: Form, given: str) -> None:
    for url in unusable_urls(form):
        assert "database URL" in error_line(run(url, given, "sessions"), form, usage=True)


@pytest.mark.postgres
def test_a_schema_behind(form: Form, given: str, empty_secret_database: RoleDatabase) -> None:
    line = error_line(run(empty_secret_database.url(), given, "sessions"), form)
    assert f"{masked(empty_secret_database)} is not a zerda_store database (it is empty)" in line
    assert "zerda-store --database-url " in line and "db upgrade`" in line


@pytest.fixture
def with_ada(secret_database: RoleDatabase) -> RoleDatabase:
    """The role's database with one session "s" in which Ada is an entity."""
    with ConversationEntityMemory(
        extractor=NamesExtractor(["Ada"]),
        database_url=secret_database.sqlalchemy_url(),
        session_id="s",
    ) as memory:
        memory.save_context({"input": "Ada called"}, {"output": "ok"})
    return secret_database


class _QuickStore(Store):
    """A store that waits 0.3 s for a lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, lock_timeout=0.3, **kwargs)


@pytest.mark.postgres
def test_a_lock_timeout(
    form: Form,
    given: str,
    with_ada: RoleDatabase,
    postgres_admin: sa.Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The commands take the store class from the package when they open one.
    monkeypatch.setattr(zerda_store, "Store", _QuickStore)
    with table_locked(postgres_admin, with_ada):
        # A recall through a unit of work, then the operators' listing (plain SQLAlchemy).
        line = error_line(run(with_ada.url(), given, "entity", "Ada", "--session", "s"), form)
        assert f"gave up after waiting 0.3 s for a lock on {masked(with_ada)}" in line
        line = error_line(run(with_ada.url(), given, "sessions"), form)
        assert line == "Error: database error: canceling statement due to lock timeout"


@pytest.mark.postgres
def test_a_lost_commit(
    form: Form, given: str, with_ada: RoleDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    lose_the_next_commit(monkeypatch)
    line = error_line(run(with_ada.url(), given, "forget", "--yes", "Ada", "--session", "s"), form)
    assert f"the connection to {masked(with_ada)} was lost during a commit" in line


# -- copy --to ----------------------------------------------------------------------------------


@pytest.fixture
def source(sqlite_url: str) -> str:
    populate(url_maker(sqlite_url))
    return sqlite_url


def copy_to(source: str, destination: str) -> Result:
    return run(source, "flag", "copy", "--to", destination)


def test_copy_to_an_unreachable_port(
    form: Form, source: str, refused_port: int, logs: pytest.LogCaptureFixture
) -> None:
    role = RoleDatabase("zerda", "127.0.0.1", refused_port, "zerda", form)
    line = error_line(copy_to(source, role.url()), form, logs)
    assert f"cannot connect to {masked(role)}" in line


@pytest.mark.postgres
def test_copy_with_a_wrong_password(
    form: Form,
    source: str,
    password_checked_database: RoleDatabase,
    logs: pytest.LogCaptureFixture,
) -> None:
    role = password_checked_database
    line = error_line(copy_to(source, role.url(WRONG)), form, logs)
    assert f"cannot connect to {masked(role)}" in line
    assert "password authentication failed" in line


@pytest.mark.postgres
def test_copy_to_a_database_without_the_schema_creates_it_without_showing_the_password(
    form: Form, source: str, empty_secret_database: RoleDatabase
) -> None:
    result = succeeded(copy_to(source, empty_secret_database.url()))
    assert "copied 3 sessions" in result.stdout
    assert form.password not in result.output


def test_copy_to_an_unusable_url(form: Form, source: str) -> None:
    for url in unusable_urls(form):
        assert "database URL" in error_line(copy_to(source, url), form, usage=True)


@pytest.mark.postgres
def test_copy_with_the_right_password(
    form: Form, source: str, password_checked_database: RoleDatabase
) -> None:
    result = succeeded(copy_to(source, password_checked_database.url()))
    assert "copied 3 sessions" in result.stdout
