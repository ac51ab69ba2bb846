"""Fixtures: one ``database_url`` parametrized over a SQLite file and a fresh Postgres
database per test.

Postgres comes from ``ZERDA_TEST_POSTGRES_URL`` (an admin URL; default: the local server as
user postgres). Without a server the Postgres tests skip with the reason, unless
``ZERDA_STORE_REQUIRE_POSTGRES=1`` (set by CI), which turns the skip into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests import passwords

# The helpers of the doubles module, and its fixtures (clock, logs, refused_port) for every suite.
from tests.doubles import POSTGRES_ADMIN_URL, clock, logs, new_postgres_database, refused_port  # noqa: F401
from zerda_store import ConversationEntityMemory, Store, migrate

REQUIRE_POSTGRES = os.environ.get("ZERDA_STORE_REQUIRE_POSTGRES") == "1"


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[sa.Engine]:
    engine = sa.create_engine(
        POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        reason = f"no Postgres server at {sa.make_url(POSTGRES_ADMIN_URL)!r}: {exc.orig}"
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A URL of a new, empty database (no tables) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'memory.db'}"
        return
    admin = request.getfixturevalue("postgres_admin")
    url, drop = new_postgres_database(admin)
    try:
        yield url
    finally:
        drop()


@pytest.fixture
def database_url(empty_database_url: str) -> str:
    """A URL of a new database already at the head revision, on each backend."""
    with Store(empty_database_url) as store:
        migrate.upgrade(store)
    return empty_database_url


@pytest.fixture
def postgres_url(postgres_admin: sa.Engine) -> Iterator[str]:
    """A new Postgres database at head, for tests that only make sense on Postgres."""
    url, drop = new_postgres_database(postgres_admin)
    with Store(url) as store:
        migrate.upgrade(store)
    try:
        yield url
    finally:
        drop()


@pytest.fixture
def sqlite_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'memory.db'}"


@pytest.fixture
def make_memory(database_url: str) -> Iterator[Callable[..., ConversationEntityMemory]]:
    """Build memories on the test's database; all are closed at the end of the test."""
    opened: list[ConversationEntityMemory] = []

    def make(*args: Any, **kwargs: Any) -> ConversationEntityMemory:
        kwargs.setdefault("database_url", database_url)
        memory = ConversationEntityMemory(*args, **kwargs)
        opened.append(memory)
        return memory

    yield make
    for memory in opened:
        memory.close()


# -- passwords in URLs ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def password_checking_admin(postgres_admin: sa.Engine) -> Iterator[sa.Engine]:
    """An admin engine on a Postgres server that checks passwords: the test server if it
    does, else a private one started for the session (skips if neither is possible)."""
    if passwords.checks_passwords(postgres_admin):
        yield postgres_admin
        return
    try:
        with passwords.private_server() as admin:
            yield admin
    except passwords.NoServer as exc:
        reason = f"the test server accepts any password and no other can be started: {exc}"
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(params=passwords.FORMS, ids=str)
def form(request: pytest.FixtureRequest) -> passwords.Form:
    """A password with "@" signs in the userinfo or the query, or a plain one in the query."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def secret_database(
    postgres_admin: sa.Engine, form: passwords.Form
) -> Iterator[passwords.RoleDatabase]:
    """A role with the form's password, owning a database at head (on the test server, which
    may not check the password)."""
    role, drop = passwords.create_role_database(postgres_admin, form)
    yield role
    drop()


@pytest.fixture
def empty_secret_database(
    postgres_admin: sa.Engine, form: passwords.Form
) -> Iterator[passwords.RoleDatabase]:
    """Like ``secret_database``, with no tables."""
    role, drop = passwords.create_role_database(postgres_admin, form, at_head=False)
    yield role
    drop()


@pytest.fixture
def password_checked_database(
    password_checking_admin: sa.Engine, form: passwords.Form
) -> Iterator[passwords.RoleDatabase]:
    """Like ``secret_database``, on a server that refuses a wrong password."""
    role, drop = passwords.create_role_database(password_checking_admin, form)
    yield role
    drop()
