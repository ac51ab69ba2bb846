"""SQLite connection settings and transactions: WAL, FULL (or NORMAL) sync, foreign keys, a
busy timeout, write transactions begun IMMEDIATE, and reads that a writer does not block."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from tests.doubles import NamesExtractor
from tests.reliability.helpers import inspect_database, table_counts
from zerda_store import ConversationEntityMemory, Store, StoreError


@pytest.fixture
def memory(sqlite_url: str) -> Iterator[ConversationEntityMemory]:
    with ConversationEntityMemory(
        extractor=NamesExtractor(["Ada", "Bo"]), database_url=sqlite_url
    ) as memory:
        yield memory


def _pragmas(engine: sa.Engine) -> dict[str, Any]:
    """The settings a brand-new connection of ``engine`` reports."""
    engine.dispose()
    with engine.connect() as connection:
        return {
            name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }


def test_a_new_connection_has_wal_full_sync_foreign_keys_and_a_busy_timeout(
    memory: ConversationEntityMemory,
) -> None:
    pragmas = _pragmas(memory.store.engine)
    assert pragmas.pop("busy_timeout") >= 5000
    assert pragmas == {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1}


def test_normal_durability_gives_synchronous_normal(sqlite_url: str) -> None:
    with Store(sqlite_url, durability="normal") as store:
        assert _pragmas(store.engine)["synchronous"] == 1
    with Store(sqlite_url) as store:
        assert _pragmas(store.engine)["synchronous"] == 2


def test_the_file_itself_stays_in_wal_mode(
    memory: ConversationEntityMemory, sqlite_url: str
) -> None:
    memory.save_context({"input": "Ada"}, {"output": "ok"})
    path = sa.make_url(sqlite_url).database
    assert path is not None
    plain = sqlite3.connect(path)  # no zerda_store settings at all
    try:
        assert plain.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        plain.close()


def _rollback_journal_file(path: str) -> None:
    """Another application's file, in SQLite's default rollback-journal mode."""
    plain = sqlite3.connect(path)
    try:
        plain.execute("CREATE TABLE notes (body TEXT)")
        plain.commit()
    finally:
        plain.close()


def _journal_mode(path: str) -> str:
    plain = sqlite3.connect(path)
    try:
        return str(plain.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        plain.close()


def test_opening_a_file_leaves_its_journal_mode_alone(sqlite_url: str) -> None:
    """WAL is switched on where zerda_store's schema is created, not on any file opened."""
    path = sa.make_url(sqlite_url).database
    assert path is not None
    _rollback_journal_file(path)
    with Store(sqlite_url) as store, store.connect() as connection:
        assert connection.exec_driver_sql("SELECT COUNT(*) FROM notes").scalar() == 0
    with pytest.raises(StoreError, match="not a zerda_store database"):
        ConversationEntityMemory(database_url=sqlite_url, auto_migrate=False)
    assert _journal_mode(path) == "delete"


def test_creating_the_schema_with_plain_alembic_switches_the_file_to_wal(tmp_path: Path) -> None:
    path = tmp_path / "plain.db"
    root = Path(__file__).resolve().parents[2]
    alembic = [sys.executable, "-m", "alembic", "-c", str(root / "alembic.ini")]
    done = subprocess.run(
        [*alembic, "-x", f"url=sqlite:///{path}", "upgrade", "head"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert _journal_mode(str(path)) == "wal"


WRITE_VERBS = ("INSERT", "UPDATE", "DELETE")


def _traced(engine: sa.Engine) -> list[str]:
    """Every statement the SQLite library runs on new connections of ``engine``."""
    statements: list[str] = []

    @event.listens_for(engine, "connect")
    def trace(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_trace_callback(statements.append)

    engine.dispose()
    return statements


def _transactions(statements: list[str]) -> list[list[str]]:
    """The statements grouped by transaction, from BEGIN to COMMIT or ROLLBACK. A lone
    SELECT outside any transaction is its own read (one statement, one snapshot); any
    other statement outside a transaction fails the test (it would write in autocommit)."""
    transactions: list[list[str]] = []
    current: list[str] | None = None
    for statement in statements:
        verb = statement.split()[0].upper()
        if verb == "PRAGMA" and current is None:
            continue
        if verb == "SELECT" and current is None:
            transactions.append([statement])
            continue
        if verb == "BEGIN":
            assert current is None, "nested BEGIN"
            current = []
        assert current is not None, f"outside a transaction: {statement}"
        current.append(statement)
        if verb in ("COMMIT", "ROLLBACK"):
            transactions.append(current)
            current = None
    assert current is None, "a transaction never ended"
    return transactions


def _write_transactions(statements: list[str]) -> list[list[str]]:
    return [
        transaction
        for transaction in _transactions(statements)
        if any(s.split()[0].upper() in WRITE_VERBS for s in transaction)
    ]


def test_save_context_writes_in_one_immediate_transaction(
    memory: ConversationEntityMemory,
) -> None:
    statements = _traced(memory.store.engine)
    memory.save_context({"input": "Ada met Bo"}, {"output": "ok"})

    [transaction] = _transactions(statements)
    assert transaction[0].upper() == "BEGIN IMMEDIATE"
    assert transaction[-1].upper() == "COMMIT"
    tables = [s.split()[2].lower() for s in transaction if s.upper().startswith("INSERT INTO")]
    # A session's first save records its key rules first, once.
    assert tables[:2] == ["session_key_rules", "turns"]
    assert tables.count("entities") == 1  # one upsert for all the turn's entities
    [snippets] = [s for s in transaction if s.upper().startswith("INSERT INTO CONTEXTS")]
    assert snippets.count("'Ada met Bo ok'") == 2  # one snippet per entity, one statement


@pytest.mark.parametrize(
    "write",
    [
        lambda memory: memory.save_contexts([({"input": "Ada"}, {"output": "ok"})] * 3),
        lambda memory: memory.entity_store["Ada"].add_context("a note"),
        lambda memory: memory.forget_entity("Bo"),
        lambda memory: memory.clear(),
    ],
    ids=["save_contexts", "add_context", "forget_entity", "clear"],
)
def test_every_write_begins_immediate(memory: ConversationEntityMemory, write: Any) -> None:
    memory.save_context({"input": "Ada met Bo"}, {"output": "ok"})
    statements = _traced(memory.store.engine)
    write(memory)
    [transaction] = _write_transactions(statements)
    assert (transaction[0].upper(), transaction[-1].upper()) == ("BEGIN IMMEDIATE", "COMMIT")


def test_reads_begin_deferred_so_they_never_wait_for_the_write_lock(
    memory: ConversationEntityMemory,
) -> None:
    memory.save_context({"input": "Ada met Bo"}, {"output": "ok"})
    statements = _traced(memory.store.engine)
    memory.load_memory_variables({"input": "Ada"})
    memory.get_entity_info("Bo")
    list(memory.chat_memory)
    transactions = _transactions(statements)
    assert transactions
    assert _write_transactions(statements) == []
    # a read is either one SELECT on its own or a deferred transaction, never IMMEDIATE
    assert {t[0].split()[0].upper() for t in transactions} == {"SELECT", "BEGIN"}
    assert {t[0].upper() for t in transactions if t[0].upper().startswith("BEGIN")} == {
        "BEGIN DEFERRED"
    }


def test_reads_go_on_while_another_connection_holds_the_write_lock(
    memory: ConversationEntityMemory, sqlite_url: str
) -> None:
    memory.save_context({"input": "Ada met Bo"}, {"output": "ok"})
    path = sa.make_url(sqlite_url).database
    assert path is not None
    writer = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("DELETE FROM contexts")  # uncommitted: readers must not see it
        assert "Ada met Bo ok" in memory.load_memory_variables({"input": "Ada"})["entity_info"]
        assert len(memory.chat_memory) == 1
        assert memory.get_memory_stats()["total_contexts"] == 2
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_foreign_keys_are_enforced_on_the_memorys_connections(
    memory: ConversationEntityMemory, sqlite_url: str
) -> None:
    with (
        pytest.raises(sa.exc.IntegrityError, match="FOREIGN KEY"),
        memory.store.engine.begin() as connection,
    ):
        connection.exec_driver_sql(
            "INSERT INTO contexts (session_id, entity_id, turn_id, turn_seq, text, created_at) "
            "VALUES ('default', 999, NULL, 0, 'orphan', 1.0)"
        )
    with inspect_database(sqlite_url) as connection:
        assert table_counts(connection) == (0, 0, 0)
