"""Postgres: a pooled connection runs every unit of work on its one psycopg cursor (a new
cursor makes its adapters anew), whether the unit runs on the calling thread, on a
database thread or from the event loop; a driver error leaves it usable, and a lost
connection's cursor goes with it."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.doubles import AsyncKeywordLLM, KeywordLLM
from zerda_store import ConversationEntityMemory, DatabaseError
from zerda_store.db.execution.driver import Cursor, compile_statement, kept_cursor
from zerda_store.db.execution.unit_of_work import OneStatement, Transaction
from zerda_store.db.store import StoreCore

pytestmark = pytest.mark.postgres

PEOPLE = ["Sarah Chen", "Omar Haddad"]
RECALLED = "Sarah Chen renewed the contract"


class MadeCursors:
    """The psycopg cursors made from now on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[Any] = []
        make = psycopg.Connection.cursor

        def counted(connection: Any, *args: Any, **kwargs: Any) -> Any:
            cursor = make(connection, *args, **kwargs)
            self.made.append(cursor)
            return cursor

        monkeypatch.setattr(psycopg.Connection, "cursor", counted)

    def __len__(self) -> int:
        return len(self.made)


def _save(memory: ConversationEntityMemory, number: int) -> None:
    memory.save_context({"input": f"{RECALLED} ({number})"}, {"output": "ok"})


def test_sync_reads_make_no_cursor_and_a_save_makes_one_for_its_lock(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(KeywordLLM(PEOPLE), store=store, auto_migrate=True)
        _save(memory, 0)
        memory.load_memory_variables({"input": "Sarah Chen?"})  # every statement compiled
        made = MadeCursors(monkeypatch)
        for _ in range(3):
            recalled = memory.load_memory_variables({"input": "How is Sarah Chen?"})
            assert RECALLED in recalled["entity_info"]
        assert len(made) == 0
        for number in range(1, 4):
            _save(memory, number)
        # The single-trip save's pipeline: the lock on a cursor of its own, the save (whose
        # rows are read) on the connection's.
        assert len(made) == 3
        assert all(cursor.closed for cursor in made.made)
        info = memory.get_entity_info("Sarah Chen")
        assert info is not None and info["recent_contexts"][-1].endswith("(3) ok")


def test_async_calls_use_the_connections_own_cursors(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StoreCore(postgres_url) as store:
        llm = AsyncKeywordLLM(PEOPLE)
        memory = ConversationEntityMemory(llm, store=store, auto_migrate=True)

        async def turns(count: int) -> list[str]:
            answers = []
            for number in range(count):
                recalled = await memory.aload_memory_variables({"input": "Sarah Chen?"})
                answers.append(recalled["entity_info"])
                await memory.asave_context({"input": f"{RECALLED} ({number})"}, {"output": "ok"})
            return answers

        asyncio.run(turns(2))  # warm: statements compiled, connections kept
        made = MadeCursors(monkeypatch)
        answers = asyncio.run(turns(3))
        assert all(RECALLED in answer for answer in answers)
        # At most the saves' lock steps: the reads and the saves' last steps reuse.
        assert len(made) <= 3
        assert all(cursor.closed for cursor in made.made)


def test_a_driver_error_leaves_the_connection_and_its_cursor_usable(postgres_url: str) -> None:
    with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(KeywordLLM(PEOPLE), store=store, auto_migrate=True)
        _save(memory, 0)
        failing = compile_statement(
            sa.text("SELECT 1 / 0 AS value").columns(sa.column("value")), store.engine.dialect
        )
        recall = memory._repository.recall_work(  # the memory's recall, on a chosen connection
            memory.session_id, [memory._mention("Sarah Chen")], 3, None
        )
        connection = store.borrow()
        connection.dbapi_connection.autocommit = True  # as a read runs
        try:
            cursor = kept_cursor(connection)
            for _ in range(3):
                with pytest.raises(psycopg.errors.DivisionByZero):
                    Transaction(Cursor(store.engine.dialect, cursor)).run(failing)
                rows, _keys = recall(Transaction(Cursor(store.engine.dialect, cursor)))
                assert [row.text for row in rows] == [f"{RECALLED} (0) ok"]
                assert kept_cursor(connection) is cursor
        finally:
            store.give_back(connection, reusable=False)
        with pytest.raises(DatabaseError, match="division by zero"):
            store.read(OneStatement(failing, {}, list))
        assert RECALLED in memory.load_memory_variables({"input": "Sarah Chen?"})["entity_info"]


def test_a_lost_connections_cursor_is_not_used_again(postgres_url: str) -> None:
    with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(KeywordLLM(PEOPLE), store=store, auto_migrate=True)
        _save(memory, 0)
        connection = store.borrow()
        old_cursor = connection.info["zerda_store.cursor"]
        with store.engine.connect() as admin:
            pid = connection.dbapi_connection.info.backend_pid
            admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        store.give_back(connection, reusable=True)
        recalled = memory.load_memory_variables({"input": "How is Sarah Chen?"})
        assert RECALLED in recalled["entity_info"]
        connection = store.borrow()
        try:
            assert connection.info["zerda_store.cursor"] is not old_cursor
            assert connection.info["zerda_store.cursor"].connection is connection.dbapi_connection
        finally:
            store.give_back(connection, reusable=True)
