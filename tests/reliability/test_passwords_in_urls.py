"""A password given in the query (``?password=...``) or holding unencoded "@" signs opens the
database with exactly that password, and no error, repr or log record shows it or any part
of it: an unreachable port, a wrong password, a bad URL, a schema behind, a lock timeout, a
lost commit (Postgres).

Every test runs with each form of the password (``tests.passwords.FORMS``).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.doubles import NamesExtractor
from tests.passwords import (
    WRONG,
    Form,
    RoleDatabase,
    everything_said,
    leaks,
    lose_the_next_commit,
    table_locked,
    unusable_urls,
)
from zerda_store import (
    CommitOutcomeUnknownError,
    ConversationEntityMemory,
    DatabaseUnavailableError,
    LockTimeoutError,
    SchemaNotCurrentError,
    Store,
    StoreError,
)
from zerda_store.db.store import core_of


def masked(role: RoleDatabase, port: int | None = None) -> str:
    """How messages show the role's URL (a password from the query is shown where a
    userinfo password is, masked the same)."""
    return f"postgresql+psycopg://{role.user}:***@{role.host}:{port or role.port}/{role.database}"


def assert_nothing_shown(error: BaseException, logs: pytest.LogCaptureFixture, form: Form) -> None:
    assert leaks(everything_said(error), form.password, WRONG) == set()
    assert leaks(logs.text, form.password, WRONG) == set()


def assert_failure_logged(logs: pytest.LogCaptureFixture) -> None:
    """SQLAlchemy's pool logged the failed connection (so the logs checked were written)."""
    assert any("Error on connect" in record.getMessage() for record in logs.records)


# -- the password reaches the server whole --------------------------------------------------


@pytest.mark.postgres
def test_the_password_opens_the_database(
    form: Form, password_checked_database: RoleDatabase
) -> None:
    role = password_checked_database
    with ConversationEntityMemory(
        extractor=NamesExtractor(["Ada"]), database_url=role.url(), session_id="s"
    ) as memory:
        memory.save_context({"input": "Ada called"}, {"output": "ok"})
        assert memory.list_entities() == ["Ada"]
        with core_of(memory.store).query() as connection:
            assert connection.exec_driver_sql("SELECT current_user").scalar() == role.user


@pytest.mark.postgres
def test_the_driver_is_given_the_whole_password(form: Form, secret_database: RoleDatabase) -> None:
    with Store(secret_database.url()) as store, store.connect() as connection:
        info = connection.connection.driver_connection.info  # type: ignore[union-attr]
        assert (info.password, info.host, info.port) == (form.password, "127.0.0.1", 5432)


@pytest.mark.postgres
def test_a_secret_query_parameter_reaches_the_driver_but_no_repr(
    form: Form, secret_database: RoleDatabase
) -> None:
    url = secret_database.url()
    url += "&sslpassword=K3y@pa55w0rd" if form.where == "query" else "?sslpassword=K3y@pa55w0rd"
    with Store(url) as store, store.connect() as connection:
        info = connection.connection.driver_connection.info  # type: ignore[union-attr]
        assert "sslpassword=K3y@pa55w0rd" in info.dsn
        shown = f"{store!r} {store.engine!r} {store.safe_url}"
    assert "sslpassword=***" in repr(store)
    assert leaks(shown, form.password, "K3y@pa55w0rd") == set()


@pytest.mark.postgres
def test_reprs_show_no_password(form: Form, secret_database: RoleDatabase) -> None:
    with ConversationEntityMemory(database_url=secret_database.url()) as memory:
        shown = [repr(memory), repr(memory.store), str(memory.store), repr(memory.store.engine)]
    assert masked(secret_database) in shown[0]
    assert leaks("\n".join(shown), form.password) == set()


# -- errors --------------------------------------------------------------------------------


def test_an_unreachable_port_is_reported_without_the_password(
    form: Form, refused_port: int, logs: pytest.LogCaptureFixture
) -> None:
    role = RoleDatabase("zerda", "127.0.0.1", refused_port, "zerda", form)
    with pytest.raises(DatabaseUnavailableError) as raised:
        ConversationEntityMemory(database_url=role.url(), auto_migrate=False)
    assert f"cannot connect to {masked(role)}" in str(raised.value)
    assert "refused" in str(raised.value)
    assert_nothing_shown(raised.value, logs, form)
    assert_failure_logged(logs)


@pytest.mark.postgres
def test_a_wrong_password_is_reported_without_either_password(
    form: Form, password_checked_database: RoleDatabase, logs: pytest.LogCaptureFixture
) -> None:
    role = password_checked_database
    with pytest.raises(DatabaseUnavailableError) as raised:
        ConversationEntityMemory(database_url=role.url(WRONG))
    assert f"cannot connect to {masked(role)}" in str(raised.value)
    assert "password authentication failed" in str(raised.value)
    assert_nothing_shown(raised.value, logs, form)
    assert_failure_logged(logs)


def test_an_unusable_url_is_refused_without_the_password(
    form: Form, logs: pytest.LogCaptureFixture
) -> None:
    for url in unusable_urls(form):
        with pytest.raises(StoreError) as raised:
            Store(url)
        assert "database URL" in str(raised.value)
        assert_nothing_shown(raised.value, logs, form)


@pytest.mark.postgres
def test_a_schema_behind_names_the_database_without_the_password(
    form: Form, empty_secret_database: RoleDatabase, logs: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(SchemaNotCurrentError) as raised:
        ConversationEntityMemory(database_url=empty_secret_database.url())
    assert f"{masked(empty_secret_database)} is not a zerda_store database (it is empty)" in str(
        raised.value
    )
    assert "zerda-store --database-url " in str(raised.value) and "db upgrade`" in str(raised.value)
    assert_nothing_shown(raised.value, logs, form)


@pytest.mark.postgres
def test_a_lock_timeout_names_the_database_without_the_password(
    form: Form,
    secret_database: RoleDatabase,
    postgres_admin: sa.Engine,
    logs: pytest.LogCaptureFixture,
) -> None:
    with (
        Store(secret_database.url(), lock_timeout=0.3) as store,
        ConversationEntityMemory(extractor=NamesExtractor(["Ada"]), store=store) as memory,
        table_locked(postgres_admin, secret_database),
        pytest.raises(LockTimeoutError) as raised,
    ):
        memory.save_context({"input": "Ada"}, {"output": "ok"})
    assert f"a lock on {masked(secret_database)}" in str(raised.value)
    assert_nothing_shown(raised.value, logs, form)


@pytest.mark.postgres
def test_a_lost_commit_names_the_database_without_the_password(
    form: Form,
    secret_database: RoleDatabase,
    monkeypatch: pytest.MonkeyPatch,
    logs: pytest.LogCaptureFixture,
) -> None:
    with ConversationEntityMemory(
        extractor=NamesExtractor(["Ada"]), database_url=secret_database.url()
    ) as memory:
        lose_the_next_commit(monkeypatch)
        with pytest.raises(CommitOutcomeUnknownError) as raised:
            memory.save_context({"input": "Ada"}, {"output": "ok"})
    assert f"the connection to {masked(secret_database)} was lost" in str(raised.value)
    assert_nothing_shown(raised.value, logs, form)
