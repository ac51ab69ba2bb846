"""Fixtures: one ``database_url`` parametrized over a SQLite file and a fresh Postgres
database per test.

Postgres comes from ``ZERDA_TEST_POSTGRES_URL`` (an admin URL; default: the local server as
user postgres). Without a server the Postgres tests skip with the reason, unless
``ZERDA_STORE_REQUIRE_POSTGRES=1`` (set by CI), which turns the skip into a failure.

With ``ZERDA_TEST_CITUS_URL`` (``scripts/test-citus`` sets it) the Postgres databases of
``empty_database_url``, ``database_url`` and the CLI's populated ones are made on a Citus
cluster instead, distributed and strict about routing (see ``tests/citus.py``), and only the
tests that use them, or are marked ``citus``, run.

With ``ZERDA_TEST_POOLER=transaction`` (or ``session``; ``scripts/test-pooler`` sets it) the
tests reach those Postgres databases through a PgBouncer in that pool mode, started for the
run (in transaction mode with the store's ``prepared_statements=false``); schemas are made
and migrated through the server itself, as an operator runs ``db upgrade``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests import citus, passwords, servers

# The helpers of the doubles module, and its fixtures (clock, logs, refused_port) for every suite.
from tests.doubles import (  # noqa: F401
    POSTGRES_ADMIN_URL,
    clock,
    direct_url,
    logs,
    new_postgres_database,
    refused_port,
)
from zerda_store import ConversationEntityMemory, Store, migrate
from zerda_store.db.connections import settings

REQUIRE_POSTGRES = os.environ.get("ZERDA_STORE_REQUIRE_POSTGRES") == "1"
POOLER_MODE = os.environ.get("ZERDA_TEST_POOLER")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the Citus mode, keep the tests of a Citus database; otherwise the tests that need a
    cluster (marked ``citus``) do not run."""
    keep = _on_citus if citus.CITUS_URL else lambda item: item.get_closest_marker("citus") is None
    kept = [item for item in items if keep(item)]
    config.hook.pytest_deselected(items=[item for item in items if not keep(item)])
    items[:] = kept


def _on_citus(item: pytest.Item) -> bool:
    if item.get_closest_marker("not_distributed") is not None:
        return False
    params = getattr(getattr(item, "callspec", None), "params", {})
    citus_params = (params.get(name) for name in ("empty_database_url", "shared_populated"))
    return item.get_closest_marker("citus") is not None or "postgres" in citus_params


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[citus.Cluster]:
    """The Citus cluster of ``ZERDA_TEST_CITUS_URL`` (a failure without one: the tests that
    ask for it run only in the Citus mode)."""
    if not citus.CITUS_URL:
        pytest.fail("ZERDA_TEST_CITUS_URL is not set: run scripts/test-citus")
    cluster = citus.Cluster(citus.CITUS_URL)
    yield cluster
    cluster.close()


@pytest.fixture(autouse=True)
def strict_on_citus(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the Citus mode, the store's connections refuse a statement on more than one shard
    (unless the test is marked ``fans_out``)."""
    if not citus.CITUS_URL or request.node.get_closest_marker("fans_out") is not None:
        return
    cluster: citus.Cluster = request.getfixturevalue("citus_cluster")
    cluster.prepare()  # the templates are made through connections that are not strict
    # The async calls run on the same engine, so this covers them too.
    monkeypatch.setattr(settings, "engine_options", citus.strict(settings.engine_options))


def new_test_database(
    request: pytest.FixtureRequest, *, at_head: bool
) -> tuple[str, Callable[[], None]]:
    """A new Postgres database for the test (at head or empty), and a drop: on the Citus
    cluster in the Citus mode (distributed when at head), else on the test server."""
    if citus.CITUS_URL:
        cluster: citus.Cluster = request.getfixturevalue("citus_cluster")
        return cluster.new_database(distributed=at_head)
    url, drop = new_postgres_database(request.getfixturevalue("postgres_admin"))
    if at_head:
        with Store(url) as store:
            migrate.upgrade(store)
    if POOLER_MODE:
        url = pooled(request, url)
    return url, drop


def pooled(request: pytest.FixtureRequest, url: str) -> str:
    """``url``'s database through the run's pooler (``ZERDA_TEST_POOLER``)."""
    bouncer: servers.PgBouncer = request.getfixturevalue("test_pooler")
    return bouncer.url(str(sa.make_url(url).database))


@pytest.fixture(scope="session")
def test_pooler() -> Iterator[servers.PgBouncer]:
    """The run's PgBouncer (``ZERDA_TEST_POOLER``) in front of the test server."""
    server = sa.make_url(POSTGRES_ADMIN_URL)
    try:
        with servers.pgbouncer(mode=POOLER_MODE, server_port=server.port or 5432) as bouncer:
            yield bouncer
    except servers.NoServer as exc:
        pytest.fail(f"ZERDA_TEST_POOLER={POOLER_MODE} but no pooler could start: {exc}")


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
    # In the Citus mode a test of database_url gets the distributed copy at once.
    distributed = bool(citus.CITUS_URL) and "database_url" in request.fixturenames
    url, drop = new_test_database(request, at_head=distributed)
    try:
        yield url
    finally:
        drop()


@pytest.fixture
def database_url(empty_database_url: str) -> str:
    """A URL of a new database already at the head revision, on each backend (distributed,
    in the Citus mode, where ``empty_database_url`` made it so)."""
    if not (citus.CITUS_URL and empty_database_url.startswith("postgresql")):
        with Store(direct_url(empty_database_url)) as store:
            migrate.upgrade(store)
    return empty_database_url


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest, postgres_admin: sa.Engine) -> Iterator[str]:
    """A new Postgres database at head, for tests that only make sense on Postgres."""
    url, drop = new_postgres_database(postgres_admin)
    with Store(url) as store:
        migrate.upgrade(store)
    try:
        yield pooled(request, url) if POOLER_MODE else url
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
