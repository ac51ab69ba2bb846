"""Closing a store while sync calls are in flight (the fourth hardening round, H11): the
connections those calls give back afterwards are closed, not left in a pool nobody uses
until garbage collection (11 server connections after 4 close/reopen rounds), and so is one
given back while the close runs."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.doubles import KeywordLLM
from tests.reliability.test_async_units_of_work import closed_connections, open_connections
from zerda_store import ConversationEntityMemory, Store, StoreError
from zerda_store.admin import AdminRepository
from zerda_store.db.store import core_of

CALLS_AT_ONCE = 4
ROUNDS = 4
STRESS_THREADS = 6
STRESS_ROUNDS = 20


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


# -- a connection given back while the store closes -----------------------------------------


def _given_back_by_a_unit_of_work(store: Store) -> None:
    core_of(store).give_back(
        core_of(store).borrow(), reusable=False
    )  # to the pool, as after a failed unit


def _given_back_by_a_query(store: Store) -> None:
    with store.connect() as connection:
        connection.exec_driver_sql("SELECT 1")


ROUTES = {"unit of work": _given_back_by_a_unit_of_work, "query": _given_back_by_a_query}


@pytest.mark.parametrize("give_back", list(ROUTES.values()), ids=list(ROUTES))
def test_a_connection_given_back_as_the_store_closes_is_closed_with_it(
    database_url, no_garbage_collection, give_back
):
    """The narrow race of H11: a connection on its way back into the pool when `close`
    runs. Held there (a pool listener) until the store is closing: it must not land in a
    pool the close has disposed of, open until garbage collection."""
    store = Store(database_url)
    returning, armed = threading.Event(), threading.Event()

    def hold_until_closing(*_: object) -> None:
        if armed.is_set():
            armed.clear()
            returning.set()
            deadline = time.monotonic() + 2
            while not store.closed and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.05)  # well inside close(): the pool disposed of, in the old code

    sa.event.listen(store.engine.pool, "checkin", hold_until_closing)
    _given_back_by_a_query(store)  # a connection to reuse, opened before the race
    armed.set()
    thread = threading.Thread(target=give_back, args=(store,))
    thread.start()
    assert returning.wait(10)
    store.close()
    thread.join(10)

    assert closed_connections(database_url), f"{open_connections(database_url)} left open"


def _give_back_until_closed(store: Store, started: threading.Barrier, n: int) -> None:
    started.wait()
    route = list(ROUTES.values())[n % len(ROUTES)]
    with contextlib.suppress(StoreError):  # the store closed under it: expected
        while True:
            route(store)


@pytest.mark.slow
def test_connections_given_back_while_the_store_closes_never_outlive_it(
    database_url, no_garbage_collection
):
    """Threads give connections back as fast as they can (to the pool and to the kept
    ones) while `close` runs, round after round: none is left open after."""
    for round_number in range(STRESS_ROUNDS):
        store = Store(database_url)
        started = threading.Barrier(STRESS_THREADS + 1)
        threads = [
            threading.Thread(target=_give_back_until_closed, args=(store, started, n))
            for n in range(STRESS_THREADS)
        ]
        for thread in threads:
            thread.start()
        started.wait()
        time.sleep(0.01 * (round_number % 5))
        store.close()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
    assert closed_connections(database_url), f"{open_connections(database_url)} left open"
