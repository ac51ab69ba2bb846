"""The store behind a real PgBouncer (Debian's ``pgbouncer``), in transaction and session
mode: threads and tasks saving and recalling through one shared store lose and double
nothing; a store without ``prepared_statements=False`` behind a transaction pooler fails
with the one error that names the option; the store's settings (lock_timeout, a schema's
search_path) hold inside each transaction; schema changes refuse to go through it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests import servers
from tests.doubles import KeywordLLM, new_postgres_database, query
from zerda_store import (
    ConversationEntityMemory,
    LockTimeoutError,
    PoolerModeError,
    Store,
    StoreError,
    migrate,
)
from zerda_store.db.store import core_of

pytestmark = pytest.mark.postgres

THREADS = 8
TURNS = 25


def _bouncer(mode: str) -> Iterator[servers.PgBouncer]:
    # In session mode each client connection holds a server connection: room for the
    # store's whole pool. In transaction mode fewer server connections than threads.
    pool_size = 4 if mode == "transaction" else 20
    yield from servers.needed(servers.pgbouncer(mode=mode, pool_size=pool_size))


@pytest.fixture(scope="module")
def transaction_pooler() -> Iterator[servers.PgBouncer]:
    yield from _bouncer("transaction")


@pytest.fixture(scope="module")
def session_pooler() -> Iterator[servers.PgBouncer]:
    yield from _bouncer("session")


@pytest.fixture
def direct_url(postgres_admin: sa.Engine) -> Iterator[str]:
    """A new database at head, on the server itself."""
    url, drop = new_postgres_database(postgres_admin)
    with Store(url) as store:
        migrate.upgrade(store)
    yield url
    drop()


def _database(url: str) -> str:
    return str(sa.make_url(url).database)


def _names(thread: int) -> list[str]:
    return [f"Client{thread}x{turn}" for turn in range(TURNS)]


def _serve(
    store: Store, thread: int, failures: list[BaseException], saved: list[str] | None = None
) -> None:
    """One customer's turns: each saved (noted in ``saved``), then recalled, which must
    find it."""
    names = _names(thread)
    memory = ConversationEntityMemory(
        llm=KeywordLLM([*names, "Riyadh"]), store=store, session_id=f"customer-{thread}"
    )
    for turn, name in enumerate(names):
        try:
            memory.save_context(
                {"input": f"{name} flies to Riyadh"},
                {"output": "noted"},
                idempotency_key=f"t{turn}",
            )
            if saved is not None:
                saved.append(name)
            recalled = memory.load_memory_variables({"input": f"What about {name}?"})
            assert f"{name} flies to Riyadh" in recalled["entity_info"], recalled
        except BaseException as exc:
            failures.append(exc)


def _run_threads(store: Store, saved: list[str] | None = None) -> list[BaseException]:
    failures: list[BaseException] = []
    threads = [
        threading.Thread(target=_serve, args=(store, thread, failures, saved))
        for thread in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def _turns_per_session(url: str) -> dict[str, int]:
    _, rows = query(url, "SELECT session_id, count(*) FROM turns GROUP BY session_id")
    return {session: count for session, count in rows}


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_threads_through_a_pooler_lose_and_double_nothing(
    mode: str, request: pytest.FixtureRequest, direct_url: str
) -> None:
    bouncer: servers.PgBouncer = request.getfixturevalue(f"{mode}_pooler")
    with Store(bouncer.url(_database(direct_url))) as store:
        assert core_of(store).prepared_statements is (None if mode == "session" else False)
        failures = _run_threads(store)
    assert failures == []
    assert _turns_per_session(direct_url) == {f"customer-{t}": TURNS for t in range(THREADS)}


def test_async_calls_through_a_transaction_pooler(
    transaction_pooler: servers.PgBouncer, direct_url: str
) -> None:
    names = [f"Guest{number}" for number in range(40)]

    async def customer(store: Store, session: int) -> None:
        memory = ConversationEntityMemory(
            llm=KeywordLLM(names), store=store, session_id=f"async-{session}"
        )
        for name in names[session::4]:
            await memory.asave_context({"input": f"{name} called"}, {"output": "ok"})
            recalled = await memory.aload_memory_variables({"input": name})
            assert f"{name} called" in recalled["entity_info"]

    async def main() -> None:
        async with Store(transaction_pooler.url(_database(direct_url))) as store:
            await asyncio.gather(*(customer(store, session) for session in range(4)))

    asyncio.run(main())
    assert _turns_per_session(direct_url) == {f"async-{s}": 10 for s in range(4)}


def test_a_store_not_told_finds_the_pooler_and_prepares_nothing(
    transaction_pooler: servers.PgBouncer, direct_url: str, logs: pytest.LogCaptureFixture
) -> None:
    url = transaction_pooler.url(_database(direct_url)).split("?")[0]  # no option
    with Store(url) as store:
        assert core_of(store).prepared_statements is None
        failures = _run_threads(store)
    assert failures == []
    assert _turns_per_session(direct_url) == {f"customer-{t}": TURNS for t in range(THREADS)}
    warnings = [r.getMessage() for r in logs.records if "connection pooler" in r.getMessage()]
    assert len(warnings) == 1 and "prepared_statements=False" in warnings[0]


def test_a_direct_connection_is_not_taken_for_a_pooler(
    direct_url: str, logs: pytest.LogCaptureFixture
) -> None:
    with Store(direct_url) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(["Omar"]), store=store)
        for _ in range(8):
            memory.save_context({"input": "Omar"}, {"output": "ok"})
        connection = store.engine.raw_connection()
        assert connection.dbapi_connection.prepare_threshold == 5  # psycopg's default
        connection.close()
    assert not [r for r in logs.records if "connection pooler" in r.getMessage()]


def test_prepared_statements_forced_behind_a_transaction_pooler_fail_naming_the_option(
    transaction_pooler: servers.PgBouncer, direct_url: str
) -> None:
    url = transaction_pooler.url(_database(direct_url)).split("?")[0]
    saved: list[str] = []
    with Store(url, prepared_statements=True) as store:
        failures = _run_threads(store, saved)
    # Statements are prepared on their sixth run, on whichever server connection the
    # pooler gave that transaction: eight threads make the next ones land elsewhere.
    assert failures, "a transaction pooler kept every prepared statement"
    assert all(isinstance(failure, StoreError) for failure in failures)
    named = [f for f in failures if isinstance(f, PoolerModeError)]
    # (A few may instead meet another client's statement of the same name, and fail on
    # its parameters: a database error of their own.)
    assert len(named) >= len(failures) // 2
    assert all("prepared_statements=False" in str(failure) for failure in named)
    # A refused save stored nothing, and none stored its turn twice.
    assert sum(_turns_per_session(direct_url).values()) == len(saved)


def test_the_option_is_read_from_the_url_and_refused_on_sqlite(tmp_path: Any) -> None:
    with Store("postgresql://app@127.0.0.1:1/crm?prepared_statements=false") as store:
        assert not core_of(store).prepared_statements
        assert "prepared_statements" not in str(store.engine.url)
    with Store("postgresql://app@127.0.0.1:1/crm", prepared_statements=False) as store:
        assert core_of(store).transaction_settings is not None
    with pytest.raises(StoreError, match="takes true or false"):
        Store("postgresql://app@127.0.0.1:1/crm?prepared_statements=maybe")
    with pytest.raises(StoreError, match="Postgres only"):
        Store(f"sqlite:///{tmp_path / 'm.db'}", prepared_statements=False)


def test_lock_timeout_holds_inside_each_pooled_transaction(
    transaction_pooler: servers.PgBouncer, direct_url: str
) -> None:
    holder = sa.create_engine(direct_url, poolclass=sa.NullPool)
    url = transaction_pooler.url(_database(direct_url))
    with Store(url, lock_timeout=0.3) as store, holder.connect() as connection:
        memory = ConversationEntityMemory(llm=KeywordLLM(["Omar"]), store=store)
        memory.save_context({"input": "Omar"}, {"output": "ok"})  # the pool's connections open
        connection.exec_driver_sql("LOCK TABLE turns IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(LockTimeoutError):
            memory.save_context({"input": "Omar again"}, {"output": "ok"})
        assert time.monotonic() - started < 3
        connection.rollback()
        memory.save_context({"input": "Omar once more"}, {"output": "ok"})
    holder.dispose()
    assert sum(_turns_per_session(direct_url).values()) == 2


def test_a_schema_holds_for_reads_and_writes_through_a_transaction_pooler(
    transaction_pooler: servers.PgBouncer, postgres_admin: sa.Engine
) -> None:
    url, drop = new_postgres_database(postgres_admin)
    try:
        with Store(url, schema="crm") as store:
            migrate.upgrade(store)
        pooled = transaction_pooler.url(_database(url))
        with Store(pooled, schema="crm") as store:
            memory = ConversationEntityMemory(llm=KeywordLLM(["Layla"]), store=store)
            for number in range(12):  # past psycopg's prepare threshold
                memory.save_context({"input": f"Layla visit {number}"}, {"output": "ok"})
                assert (
                    "Layla visit" in memory.load_memory_variables({"input": "Layla"})["entity_info"]
                )
            assert memory.list_entities() == ["Layla"]
        _, rows = query(url, "SELECT count(*) FROM crm.turns")
        assert rows == [(12,)]
    finally:
        drop()


def test_schema_changes_refuse_a_transaction_pooler(
    transaction_pooler: servers.PgBouncer, direct_url: str
) -> None:
    url = transaction_pooler.url(_database(direct_url))
    with Store(url) as store, pytest.raises(StoreError, match="URL of the server itself"):
        migrate.upgrade(store)


def test_a_granted_service_role_works_through_a_transaction_pooler(
    transaction_pooler: servers.PgBouncer, postgres_admin: sa.Engine
) -> None:
    """The production set-up: the owner upgrades and grants on the server itself, the
    service role's store goes through the pooler, with a schema of its own."""
    from tests.integration.test_roles import drop_roles, make_roles  # the roles' helpers

    roles = make_roles(postgres_admin, schema="crm")
    try:
        succeeded = roles.cli(roles.owner, "db", "grant", "--service", roles.service)
        assert succeeded.exit_code == 0, succeeded.output
        transaction_pooler.add_user(roles.service)
        pooled = transaction_pooler.url(roles.database, user=roles.service)
        with Store(pooled, schema="crm", lock_timeout=1.0) as store:
            memory = ConversationEntityMemory(llm=KeywordLLM(["Layla", "Omar"]), store=store)
            for number in range(8):
                memory.save_context({"input": f"Layla met Omar ({number})"}, {"output": "ok"})
                recalled = memory.load_memory_variables({"input": "Layla"})["entity_info"]
                assert f"({number})" in recalled
            assert memory.forget_entity("Omar")
            assert memory.list_entities() == ["Layla"]
            with pytest.raises(StoreError, match="URL of the server itself"):
                migrate.upgrade(store)
    finally:
        drop_roles(postgres_admin, roles)
