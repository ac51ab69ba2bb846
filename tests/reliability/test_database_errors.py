"""Every error the database raises reaches the caller as a :class:`zerda_store.StoreError`
subclass with a one-line message (never SQLAlchemy's or the driver's own exception): a role
without privileges, a statement cancelled by ``statement_timeout``, a pool whose
connections all stay in use, another application's database. Nothing is written, and a
file that is not zerda_store's is left exactly as it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import KeywordLLM
from tests.integration.test_foreign_databases import run as _run
from zerda_store import (
    ConversationEntityMemory,
    DatabaseError,
    NotAStoreDatabaseError,
    PermissionDeniedError,
    PoolExhaustedError,
    StatementTimeoutError,
    Store,
    StoreError,
    migrate,
)
from zerda_store.db.execution.unit_of_work import SESSION_LOCK_NAMESPACE
from zerda_store.db.store import core_of

NAMES = ("Sarah Chen", "Acme Corp")
SESSION = "crm-errors"


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message
    assert "sqlalche.me" not in message
    return message


def _save(memory: ConversationEntityMemory) -> None:
    memory.save_context({"input": "Sarah Chen joined Acme Corp"}, {"output": "noted"})


def _asave(memory: ConversationEntityMemory) -> None:
    asyncio.run(memory.asave_context({"input": "Sarah Chen joined Acme Corp"}, {"output": "ok"}))


def _load(memory: ConversationEntityMemory) -> None:
    memory.load_memory_variables({"input": "Sarah Chen?"})


def _aload(memory: ConversationEntityMemory) -> None:
    asyncio.run(memory.aload_memory_variables({"input": "Sarah Chen?"}))


CALLS: dict[str, Callable[[ConversationEntityMemory], None]] = {
    "save_context": _save,
    "asave_context": _asave,
    "load_memory_variables": _load,
    "aload_memory_variables": _aload,
}


def _turns(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.exec_driver_sql("SELECT count(*) FROM turns").scalar_one())
    finally:
        engine.dispose()


# -- another application's database ----------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def foreign_sqlite_file(tmp_path: Path) -> Path:
    """Another application's SQLite file, journal mode ``delete``, with its own ``turns``."""
    path = tmp_path / "other-app.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE turns (id INTEGER PRIMARY KEY, said TEXT)")
    connection.execute("INSERT INTO turns (said) VALUES ('hello')")
    connection.commit()
    connection.close()
    return path


@pytest.mark.parametrize("auto_migrate", [None, True])
def test_another_applications_sqlite_file_is_refused_and_left_unchanged(
    foreign_sqlite_file: Path, auto_migrate: bool | None
) -> None:
    before = _digest(foreign_sqlite_file)
    with pytest.raises(NotAStoreDatabaseError) as caught:
        ConversationEntityMemory(
            database_url=f"sqlite:///{foreign_sqlite_file}", auto_migrate=auto_migrate
        )
    assert "turns" in one_line(caught.value)
    assert _digest(foreign_sqlite_file) == before
    assert sorted(p.name for p in foreign_sqlite_file.parent.iterdir()) == ["other-app.db"]
    plain = sqlite3.connect(foreign_sqlite_file)
    try:
        assert plain.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        plain.close()


def test_db_upgrade_refuses_a_database_whose_tables_have_zerda_stores_names(
    empty_database_url: str,
) -> None:
    _run(empty_database_url, "CREATE TABLE turns (id INTEGER PRIMARY KEY, said TEXT)")
    with Store(empty_database_url) as store, pytest.raises(NotAStoreDatabaseError) as caught:
        migrate.upgrade(store)
    assert "turns" in one_line(caught.value)
    engine = sa.create_engine(empty_database_url)
    try:
        assert sa.inspect(engine).get_table_names() == ["turns"]
    finally:
        engine.dispose()


def test_a_new_sqlite_file_beside_other_tables_is_left_to_db_upgrade(tmp_path: Path) -> None:
    """Opening a file is not the moment to add tables beside another application's."""
    path = tmp_path / "shared.db"
    _run(f"sqlite:///{path}", "CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    before = _digest(path)
    with pytest.raises(NotAStoreDatabaseError, match="db upgrade"):
        ConversationEntityMemory(database_url=f"sqlite:///{path}")
    assert _digest(path) == before
    with Store(f"sqlite:///{path}") as store:
        migrate.upgrade(store)  # asked for: the tables go beside the others
    with ConversationEntityMemory(KeywordLLM(NAMES), database_url=f"sqlite:///{path}") as memory:
        _save(memory)
    assert _turns(f"sqlite:///{path}") == 1


# -- Postgres: privileges and statement_timeout -------------------------------------------


@pytest.fixture
def restricted_role(postgres_url: str) -> Iterator[tuple[str, str]]:
    """A login role on the test database that may read the version and retention tables
    (what a memory reads when it is made) and nothing else; yields its URL and name."""
    role = f"zerda_role_{uuid.uuid4().hex[:8]}"
    _run(
        postgres_url,
        f"CREATE ROLE {role} LOGIN",
        f"GRANT SELECT ON alembic_version, retention_policies TO {role}",
    )
    try:
        yield sa.make_url(postgres_url).set(username=role).render_as_string(False), role
    finally:
        _run(postgres_url, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


@pytest.mark.postgres
@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_role_without_privileges_gets_a_permission_error(
    restricted_role: tuple[str, str], postgres_url: str, call: Callable[..., None]
) -> None:
    url, _ = restricted_role
    with (
        ConversationEntityMemory(KeywordLLM(NAMES), database_url=url) as memory,
        pytest.raises(PermissionDeniedError) as caught,
    ):
        call(memory)
    message = one_line(caught.value)
    assert "permission denied" in message and "GRANT" in message
    assert _turns(postgres_url) == 0


@pytest.mark.postgres
def test_a_role_that_cannot_read_the_version_table_gets_a_permission_error(
    restricted_role: tuple[str, str], postgres_url: str
) -> None:
    url, role = restricted_role
    _run(postgres_url, f"REVOKE SELECT ON alembic_version FROM {role}")
    with pytest.raises(PermissionDeniedError) as caught:
        ConversationEntityMemory(KeywordLLM(NAMES), database_url=url)
    assert "alembic_version" in one_line(caught.value)


@pytest.mark.postgres
@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_statement_timeout_is_a_store_error_and_stores_nothing(
    postgres_url: str, call: Callable[..., None]
) -> None:
    database = sa.make_url(postgres_url).database
    _run(postgres_url, f"ALTER DATABASE \"{database}\" SET statement_timeout = '200ms'")
    holder = sa.create_engine(postgres_url)
    try:
        with ConversationEntityMemory(
            KeywordLLM(NAMES), database_url=postgres_url, session_id=SESSION
        ) as memory:
            _save(memory)  # the session exists; its recall reads it
            with holder.connect() as connection, connection.begin():
                # Every statement of the session's units of work queues behind this lock
                # (saves take it shared; recall's tables are locked below), until the
                # server cancels it.
                connection.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:ns, hashtext(:session))"),
                    {"ns": SESSION_LOCK_NAMESPACE, "session": SESSION},
                )
                connection.exec_driver_sql("LOCK TABLE contexts IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(StatementTimeoutError) as caught:
                    call(memory)
    finally:
        holder.dispose()
    assert "statement_timeout" in one_line(caught.value)
    assert _turns(postgres_url) == 1


# -- a pool whose connections all stay in use -----------------------------------------------


def test_an_exhausted_pool_is_a_store_error_that_names_its_size(database_url: str) -> None:
    with Store(database_url, pool_timeout=0.2) as store:
        memory = ConversationEntityMemory(KeywordLLM(NAMES), store=store, session_id=SESSION)
        core_of(store).drop_connections()  # none kept aside for the next call
        held: list[Any] = []
        try:
            while True:  # take every connection the pool will give
                held.append(store.engine.raw_connection())
        except sa.exc.TimeoutError:
            pass
        try:
            for call in CALLS.values():
                with pytest.raises(PoolExhaustedError) as caught:
                    call(memory)
                message = one_line(caught.value)
                assert f"all {len(held)} connections" in message
                assert "pool_size" in message or "async_pool_size" in message
        finally:
            for connection in held:
                connection.close()
        _save(memory)  # connections free again: it works
    assert _turns(database_url) == 1


def test_every_mapped_error_is_a_store_error() -> None:
    for error in (PermissionDeniedError, StatementTimeoutError, PoolExhaustedError):
        assert issubclass(error, StoreError)


# -- any other error of the database -------------------------------------------------------

REFUSING_TRIGGER = {
    "sqlite": [
        "CREATE TRIGGER refuse BEFORE INSERT ON contexts "
        "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
        "RAISE EXCEPTION 'refused by a trigger'; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse BEFORE INSERT ON contexts FOR EACH ROW EXECUTE FUNCTION refuse()",
    ],
}


@pytest.mark.parametrize("call", [_save, _asave], ids=["save_context", "asave_context"])
def test_any_other_database_error_is_a_store_error_and_stores_nothing(
    database_url: str, call: Callable[..., None]
) -> None:
    _run(database_url, *REFUSING_TRIGGER[sa.make_url(database_url).get_backend_name()])
    with (
        ConversationEntityMemory(KeywordLLM(NAMES), database_url=database_url) as memory,
        pytest.raises(DatabaseError) as caught,
    ):
        call(memory)
    assert "refused by a trigger" in one_line(caught.value)
    assert _turns(database_url) == 0
