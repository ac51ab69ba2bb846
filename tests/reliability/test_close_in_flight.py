"""Closing a store while sync calls are in flight (the fourth hardening round, H11): the
connections those calls give back afterwards are closed, not left in a pool nobody uses
until garbage collection (11 server connections after 4 close/reopen rounds)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import pytest

from tests.doubles import KeywordLLM
from tests.reliability.test_async_units_of_work import closed_connections, open_connections
from zerda_store import ConversationEntityMemory, Store, StoreError
from zerda_store.admin import AdminRepository

CALLS_AT_ONCE = 4
ROUNDS = 4


@pytest.fixture
def no_garbage_collection() -> Iterator[None]:
    """What the test counts must be closed by the store, not by the collector."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _busy(store: Store, started: threading.Barrier) -> None:
    memory = ConversationEntityMemory(KeywordLLM(["Sarah"]), store=store, session_id="s")
    started.wait()
    try:
        for n in range(200):
            memory.save_context({"input": f"Sarah, call {n}"}, {"output": "ok"})
            memory.load_memory_variables({"input": "Sarah"})
            AdminRepository(store).sessions()
    except StoreError:
        pass  # the store closed under it: expected


def test_closing_a_store_with_sync_calls_in_flight_closes_their_connections(
    database_url, no_garbage_collection
):
    for _ in range(ROUNDS):
        store = Store(database_url)
        started = threading.Barrier(CALLS_AT_ONCE + 1)
        threads = [
            threading.Thread(target=_busy, args=(store, started)) for _ in range(CALLS_AT_ONCE)
        ]
        for thread in threads:
            thread.start()
        started.wait()
        time.sleep(0.2)
        store.close()
        for thread in threads:
            thread.join(60)
    assert closed_connections(database_url), f"{open_connections(database_url)} left open"
