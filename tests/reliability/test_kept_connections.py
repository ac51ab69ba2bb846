"""Connections a store keeps between units of work: never shared with a forked child,
dropped with the engine, returned when a unit of work fails."""

from __future__ import annotations

import os

import pytest

import zerda_store.db.connections.idle as kept_module
from tests.doubles import FixedLLM
from zerda_store import ConversationEntityMemory
from zerda_store.db.execution.unit_of_work import Transaction
from zerda_store.db.store import StoreCore
from zerda_store.turns.queries import Queries


def _save(memory: ConversationEntityMemory, text: str) -> None:
    memory.save_context({"input": text}, {"output": "ok"})


def _in_child(work) -> int:
    """Run ``work`` in a forked child; its exit code (0 when ``work`` returned True)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if work() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _alive(connection) -> bool:
    cursor = connection.cursor()
    try:
        cursor.execute("SELECT 1")
        return cursor.fetchall()[0][0] == 1
    finally:
        cursor.close()


@pytest.mark.parametrize("child_disposes", [False, True], ids=["plain", "dispose-close-false"])
def test_a_forked_child_never_touches_its_parents_connections(database_url, child_disposes):
    with StoreCore(database_url) as store:
        memory = ConversationEntityMemory(FixedLLM("Sarah"), store=store)
        _save(memory, "parent before the fork")
        kept = store.borrow()
        store.give_back(kept, reusable=True)

        def child() -> bool:
            if child_disposes:  # what SQLAlchemy advises a forked child to do
                store.engine.dispose(close=False)
            own = store.borrow()
            store.give_back(own, reusable=True)
            _save(memory, "child")
            return own.dbapi_connection is not kept.dbapi_connection

        assert _in_child(child) == 0
        assert store.borrow() is kept and _alive(kept)  # the parent's connection survived
        store.give_back(kept, reusable=True)
        _save(memory, "parent after the fork")
        assert [turn["input"] for turn in memory.chat_memory] == [
            "parent before the fork",
            "child",
            "parent after the fork",
        ]


def test_disposing_the_engine_drops_the_kept_connections(database_url):
    with StoreCore(database_url) as store:
        _save(ConversationEntityMemory(FixedLLM("Sarah"), store=store), "one")
        kept = store.borrow()
        driver_connection = kept.dbapi_connection
        store.give_back(kept, reusable=True)
        store.engine.dispose()
        assert not kept.is_valid  # dropped, not left open beside the new pool
        assert store.borrow().dbapi_connection is not driver_connection


def test_a_failed_unit_of_work_leaves_no_transaction_open(database_url):
    with StoreCore(database_url) as store:
        memory = ConversationEntityMemory(FixedLLM("Sarah"), store=store)
        _save(memory, "one")
        queries = store.statements(Queries)

        def note_then_fail(transaction: Transaction) -> None:
            values = {
                "session_id": "default",
                "entity_id": 1,
                "turn_seq": 1,
                "text": "half done",
                "created_at": 1.0,
            }
            transaction.run(queries.add_context, values)
            raise RuntimeError("the work failed")

        with pytest.raises(RuntimeError):
            store.write(note_then_fail)
        with StoreCore(database_url, lock_timeout=0.5) as other:
            other_memory = ConversationEntityMemory(FixedLLM("Sarah"), store=other)
            _save(other_memory, "two")  # would time out if the failed unit held a lock
        assert memory.entity_store["Sarah"].contexts == ["one ok", "two ok"]


def test_a_connection_kept_too_long_goes_back_through_the_pool(database_url, monkeypatch):
    with StoreCore(database_url) as store:
        kept = store.borrow()
        store.give_back(kept, reusable=True)
        assert store.borrow() is kept  # given back just now: used again directly
        store.give_back(kept, reusable=True)
        monkeypatch.setattr(kept_module, "KEPT_SECONDS", 0.0)
        fresh = store.borrow()
        assert fresh is not kept
        assert not kept.is_valid or kept.dbapi_connection is None  # returned to the pool
