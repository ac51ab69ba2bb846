"""Postgres connections that die under the memory: between calls the next call works
without a restart; during a save the call succeeds or raises, and a retry with the same
idempotency key never stores the turn twice.

The server itself is never restarted: other suites share it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.doubles import NamesExtractor, driver_calls
from tests.reliability.helpers import (
    duplicated_tags,
    inspect_database,
    snippet_keys_by_turn,
    table_counts,
)
from zerda_store import ConversationEntityMemory, DatabaseUnavailableError, StoreError
from zerda_store.db.schema import turns

pytestmark = pytest.mark.postgres

NAMES = ["Alice Harper", "Bilal Haddad", "Carla Díaz"]


class Terminator:
    """Ends backends of one database from the admin connection, and waits until they are gone."""

    def __init__(self, admin: sa.Engine, database: str) -> None:
        self.admin = admin
        self.database = database

    def backends(self) -> list[int]:
        with self.admin.connect() as connection:
            return list(
                connection.execute(
                    sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :db"),
                    {"db": self.database},
                ).scalars()
            )

    def terminate(self, pids: list[int]) -> None:
        with self.admin.connect() as connection:
            for pid in pids:
                connection.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        for _ in range(500):
            if not set(pids) & set(self.backends()):
                return
            time.sleep(0.01)
        pytest.fail(f"backends {pids} outlived pg_terminate_backend")

    def terminate_all(self) -> int:
        pids = self.backends()
        self.terminate(pids)
        return len(pids)


@pytest.fixture
def terminator(postgres_url: str, postgres_admin: sa.Engine) -> Terminator:
    database = sa.make_url(postgres_url).database
    assert database is not None
    return Terminator(postgres_admin, database)


@pytest.fixture
def memory(postgres_url: str) -> Iterator[ConversationEntityMemory]:
    memory = ConversationEntityMemory(
        extractor=NamesExtractor(NAMES), database_url=postgres_url, session_id="crm-lost"
    )
    yield memory
    memory.close()


def _backend_pid(connection: Any) -> int:
    return int(connection.connection.dbapi_connection.info.backend_pid)


def _turn_rows(url: str, tag: str) -> list[Any]:
    with inspect_database(url) as connection:
        return connection.execute(sa.select(turns.c.id).where(turns.c.idempotency_key == tag)).all()


def test_calls_after_the_connections_were_terminated_work(
    memory: ConversationEntityMemory, terminator: Terminator, postgres_url: str
) -> None:
    memory.save_context({"input": "[t0] Alice Harper renewed."}, {"output": "Noted."})

    assert terminator.terminate_all() >= 1
    memory.save_context({"input": "[t1] Bilal Haddad called."}, {"output": "Noted."})

    assert terminator.terminate_all() >= 1
    recalled = memory.load_memory_variables({"input": "Alice Harper?"})["entity_info"]
    assert "[t0] Alice Harper renewed. Noted." in recalled

    assert terminator.terminate_all() >= 1
    assert [turn["input"] for turn in memory.chat_memory] == [
        "[t0] Alice Harper renewed.",
        "[t1] Bilal Haddad called.",
    ]
    assert terminator.terminate_all() >= 1
    info = memory.get_entity_info("alice harper")
    assert info is not None
    assert info["contexts_count"] == 2

    with inspect_database(postgres_url) as connection:
        assert table_counts(connection, "crm-lost") == (2, 3, 6)


def _fill_the_pool(memory: ConversationEntityMemory, count: int) -> None:
    """Leave ``count`` idle connections in the pool, as after concurrent use."""
    held = [memory.store.engine.raw_connection() for _ in range(count)]
    for connection in held:
        connection.close()
    assert memory.store.engine.pool.checkedin() >= count  # type: ignore[attr-defined]


@pytest.mark.parametrize("call", ["save_context", "load_memory_variables"])
def test_a_pool_full_of_dead_connections_does_not_fail_the_next_call(
    memory: ConversationEntityMemory, terminator: Terminator, call: str
) -> None:
    """More dead connections than attempts: after the first lost one, the rest of the
    pool is dropped instead of being tried one by one."""
    memory.save_context({"input": "[t0] Alice Harper renewed."}, {"output": "Noted."})
    _fill_the_pool(memory, 5)  # the pool keeps 5; a call makes at most 4 attempts
    assert terminator.terminate_all() >= 5

    if call == "save_context":
        memory.save_context({"input": "[t1] Alice Harper again."}, {"output": "Noted."})
        assert len(memory.chat_memory) == 2
    else:
        recalled = memory.load_memory_variables({"input": "Alice Harper?"})["entity_info"]
        assert "[t0] Alice Harper renewed. Noted." in recalled


def test_a_server_that_refuses_connections_is_reported_as_unavailable(
    memory: ConversationEntityMemory, terminator: Terminator, postgres_admin: sa.Engine
) -> None:
    memory.save_context({"input": "[t0] Alice Harper renewed."}, {"output": "Noted."})
    database = terminator.database
    with postgres_admin.connect() as connection:
        connection.execute(sa.text(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS false'))
    try:
        terminator.terminate_all()
        for call in (
            lambda: memory.load_memory_variables({"input": "Alice Harper?"}),
            lambda: memory.save_context({"input": "Alice Harper"}, {"output": "x"}),
        ):
            with pytest.raises(DatabaseUnavailableError, match="cannot connect to postgresql"):
                call()
    finally:
        with postgres_admin.connect() as connection:
            connection.execute(sa.text(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true'))
    memory.save_context({"input": "[t1] Alice Harper again."}, {"output": "Noted."})
    assert len(memory.chat_memory) == 2


def _points_of_a_keyed_save(memory: ConversationEntityMemory) -> int:
    """Where a keyed save can lose its connection: before each statement, and before the
    COMMIT if it sends one (a save sent as one pipeline commits at the pipeline's end,
    which the last statement's point covers: the backend is gone before the sync)."""
    # A session's first save records its key rules too: count a later one's statements.
    memory.save_context({"input": "[warm up]"}, {"output": ""}, idempotency_key="warm-up")
    commits: list[object] = []
    with driver_calls(memory.store.engine, before_commit=commits.append) as statements:
        memory.save_context({"input": "[dry run]"}, {"output": ""}, idempotency_key="dry-run")
    return len(statements) + len(commits)


def _save_until_stored(memory: ConversationEntityMemory, tag: str) -> bool:
    """Save a keyed turn; if the call raises, deliver it again as a client would.
    True if the first call raised."""
    inputs, outputs = {"input": f"[{tag}] Alice Harper, Bilal Haddad"}, {"output": "Ok."}
    try:
        memory.save_context(inputs, outputs, idempotency_key=tag)
    except (sa.exc.DBAPIError, StoreError):
        memory.save_context(inputs, outputs, idempotency_key=tag)
        return True
    return False


class TerminateAt:
    """Terminates the backend of the connection that runs the ``index``-th statement
    (0-based) on an engine, or, for ``index`` == the statement count, that is about to
    COMMIT. Once."""

    def __init__(self, terminator: Terminator, index: int) -> None:
        self.terminator = terminator
        self.index = index
        self.statements = 0
        self.done = False

    def before_statement(self, cursor: Any, *_: Any) -> None:
        self.statements += 1
        if self.statements - 1 == self.index:
            self._terminate(cursor.connection)

    def before_commit(self, pooled_connection: Any) -> None:
        if self.statements == self.index:
            self._terminate(pooled_connection.dbapi_connection)

    def _terminate(self, driver_connection: Any) -> None:
        if not self.done:
            self.done = True
            self.terminator.terminate([driver_connection.info.backend_pid])


def test_a_connection_terminated_during_a_save_never_stores_the_turn_twice(
    memory: ConversationEntityMemory, terminator: Terminator, postgres_url: str
) -> None:
    points = _points_of_a_keyed_save(memory)
    assert points >= 3  # the idempotency read, the session's lock, the save

    for index in range(points):
        terminate = TerminateAt(terminator, index)
        with driver_calls(
            memory.store.engine,
            before_statement=terminate.before_statement,
            before_commit=terminate.before_commit,
        ):
            _save_until_stored(memory, f"k{index}")
        assert terminate.done, index
        assert len(_turn_rows(postgres_url, f"k{index}")) == 1, index

    with inspect_database(postgres_url) as connection:
        assert duplicated_tags(connection, "crm-lost") == []
        stored = snippet_keys_by_turn(connection, "crm-lost")
    assert len(stored) == points + 2  # and the warm-up and the dry run
    assert all(
        sorted(keys) == ["alice harper", "bilal haddad", "carla diaz"] for keys in stored.values()
    )


@pytest.fixture
def lost_after_commit(
    memory: ConversationEntityMemory, terminator: Terminator, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Make the next COMMIT reach the server and then lose the connection before the
    client hears back, as when the network drops at that moment. Counts such commits."""
    dialect = memory.store.engine.dialect
    commit = dialect.do_commit
    lost: list[int] = []

    def do_commit(pooled_connection: Any) -> None:
        commit(pooled_connection)
        if lost:
            return
        raw = pooled_connection.dbapi_connection
        lost.append(raw.info.backend_pid)
        terminator.terminate([raw.info.backend_pid])
        raw.execute("SELECT 1")  # raises: the connection is gone
        raise AssertionError("the terminated connection still answered")

    monkeypatch.setattr(dialect, "do_commit", do_commit)

    # A save sent as one pipeline commits when the server reaches the pipeline's sync.
    open_pipeline = psycopg.Connection.pipeline

    @contextlib.contextmanager
    def pipeline(raw: psycopg.Connection[Any]) -> Iterator[Any]:
        with open_pipeline(raw) as opened:
            yield opened
        if lost:
            return
        lost.append(raw.info.backend_pid)
        terminator.terminate([raw.info.backend_pid])
        raw.execute("SELECT 1")  # raises: the connection is gone
        raise AssertionError("the terminated connection still answered")

    monkeypatch.setattr(psycopg.Connection, "pipeline", pipeline)
    return lost


def test_a_commit_whose_answer_is_lost_is_not_stored_twice_with_a_key(
    memory: ConversationEntityMemory, lost_after_commit: list[int], postgres_url: str
) -> None:
    _save_until_stored(memory, "m-1")
    assert len(lost_after_commit) == 1
    assert len(_turn_rows(postgres_url, "m-1")) == 1
    with inspect_database(postgres_url) as connection:
        assert table_counts(connection, "crm-lost") == (1, 3, 3)


def test_a_commit_whose_answer_is_lost_is_not_stored_twice_without_a_key(
    memory: ConversationEntityMemory, lost_after_commit: list[int], postgres_url: str
) -> None:
    # Raising would be fine (the caller cannot know); storing the turn twice is not.
    with contextlib.suppress(sa.exc.DBAPIError, StoreError):
        memory.save_context({"input": "[once] Alice Harper"}, {"output": "Ok."})
    assert len(lost_after_commit) == 1
    with inspect_database(postgres_url) as connection:
        assert table_counts(connection, "crm-lost").turns == 1


def test_a_terminated_connection_is_seen_as_a_disconnect(
    memory: ConversationEntityMemory, terminator: Terminator
) -> None:
    """What the lost-commit simulation above relies on: psycopg marks the connection
    broken and SQLAlchemy reports the error as an invalidated connection."""
    with memory.store.engine.connect() as connection:
        terminator.terminate([_backend_pid(connection)])
        with pytest.raises(sa.exc.OperationalError) as raised:
            connection.exec_driver_sql("SELECT 1")
    assert raised.value.connection_invalidated
    assert isinstance(raised.value.orig, psycopg.OperationalError)


def test_a_single_trip_save_whose_answer_is_lost_is_not_stored_twice(
    memory: ConversationEntityMemory, terminator: Terminator, postgres_url: str
) -> None:
    """A later save of the session goes as one pipeline (the first one also records the
    key rules): its answer lost after the server committed, the call raises or succeeds
    but never stores the turn twice, and a retry with the key is a no-op."""
    memory.save_context({"input": "[warm up] Alice Harper"}, {"output": "Ok."})
    open_pipeline = psycopg.Connection.pipeline
    lost: list[int] = []

    @contextlib.contextmanager
    def pipeline(raw: psycopg.Connection[Any]) -> Iterator[Any]:
        with open_pipeline(raw) as opened:
            yield opened
        if not lost:
            lost.append(raw.info.backend_pid)
            terminator.terminate([raw.info.backend_pid])
            raw.execute("SELECT 1")  # raises: the connection is gone

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(psycopg.Connection, "pipeline", pipeline)
        assert _save_until_stored(memory, "p-1") is True
    assert len(lost) == 1
    assert len(_turn_rows(postgres_url, "p-1")) == 1
    with inspect_database(postgres_url) as connection:
        assert table_counts(connection, "crm-lost") == (2, 3, 6)
