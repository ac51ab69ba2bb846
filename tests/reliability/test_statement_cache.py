"""Statements are compiled once per store, never per memory, and never while a write
transaction holds its locks."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.sql.elements import CompilerElement

from tests.doubles import BrokenLLM, KeywordLLM
from zerda_store import ConversationEntityMemory, Store

NAMES = ["Sarah Chen", "Omar", "Acme Corp", "Bilal Haddad"]


@contextmanager
def compilations(check: Callable[[], None] = lambda: None) -> Iterator[list[str]]:
    """Every SQLAlchemy compilation inside the block; ``check`` runs before each one."""
    compiled: list[str] = []
    original = CompilerElement.compile

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        check()
        compiled.append(type(self).__name__)
        return original(self, *args, **kwargs)

    CompilerElement.compile = counting  # type: ignore[method-assign]
    try:
        yield compiled
    finally:
        CompilerElement.compile = original  # type: ignore[method-assign]


def one_request(store: Store, session_id: str, number: int) -> None:
    """What a service does with a memory made for one request."""
    memory = ConversationEntityMemory(KeywordLLM(NAMES), store=store, session_id=session_id)
    with memory:
        memory.load_memory_variables({"input": "What about Sarah Chen?"})
        memory.save_context(
            {"input": f"Sarah Chen from Acme Corp called ({number})"},
            {"output": "Noted for Omar"},
            idempotency_key=f"message-{number}",
        )
        memory.save_contexts([({"input": "Omar met Bilal Haddad"}, {"output": "ok"})] * 12)
        memory.get_entity_info("Sarah Chen")
        memory.entity_store["Omar"].add_context("Omar prefers email")
        memory.get_memory_stats()
        list(memory.chat_memory)
        memory.list_entities()
        memory.forget_entity("Bilal Haddad")


def every_operation(store: Store, session_id: str) -> None:
    one_request(store, session_id, 1)
    failing = ConversationEntityMemory(BrokenLLM(), store=store, session_id=session_id)
    failing.save_context({"input": "Sarah Chen again"}, {"output": "ok"})
    repairing = ConversationEntityMemory(KeywordLLM(NAMES), store=store, session_id=session_id)
    repairing.reextract()
    repairing.forget_entity("Sarah Chen", with_turns=True)
    repairing.clear()


def test_a_new_memory_on_a_store_compiles_nothing_the_store_has_compiled(database_url):
    with Store(database_url) as store:
        every_operation(store, "warm-up")
        with compilations() as compiled:
            every_operation(store, "customer-2")
            one_request(store, "customer-3", 2)
    assert compiled == []


def test_memories_on_different_stores_compile_their_own_statements(database_url):
    with Store(database_url) as first, Store(database_url) as second:
        one_request(first, "a", 1)
        with compilations() as compiled:
            one_request(second, "b", 1)
    assert compiled


def _write_lock_checker(store: Store, database_url: str) -> tuple[Callable[[], None], list[str]]:
    """A check that records when a compilation runs while one of the store's connections
    is inside a transaction that holds write locks."""
    held: list[str] = []
    if store.dialect == "sqlite":
        path = sa.make_url(database_url).database

        def check() -> None:
            probe = sqlite3.connect(path, timeout=0, isolation_level=None)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
            except sqlite3.OperationalError as exc:
                held.append(str(exc))
            finally:
                probe.close()

        return check, held

    probe_engine = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    ours = threading.get_ident()

    def check() -> None:
        if threading.get_ident() != ours:
            return
        with probe_engine.connect() as probe:
            open_transactions = probe.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()"
            ).scalar_one()
        if open_transactions:
            held.append(f"{open_transactions} transactions open")

    return check, held


def test_no_statement_is_compiled_inside_a_write_transaction(database_url):
    with Store(database_url) as store:
        ConversationEntityMemory(store=store, session_id="schema").get_memory_stats()
        check, held = _write_lock_checker(store, database_url)
        with compilations(check) as compiled:
            every_operation(store, "customer")
    assert compiled, "a fresh store compiles its statements at first use"
    assert held == []


@pytest.mark.slow
def test_many_concurrent_requests_with_a_memory_each_all_succeed(database_url):
    threads, requests = 8, 6
    errors: list[BaseException] = []
    with Store(database_url) as store:
        ConversationEntityMemory(store=store).get_memory_stats()

        def customer(number: int) -> None:
            try:
                for request in range(requests):
                    one_request(store, f"customer-{number}", request)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=customer, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
        for number in range(threads):
            memory = ConversationEntityMemory(store=store, session_id=f"customer-{number}")
            assert len(memory.chat_memory) == requests * 13
