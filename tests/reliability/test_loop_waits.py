"""Postgres: a unit of work on the event loop that finds no kept connection while others
of its kind are out waits on the loop for one given back (:mod:`zerda_store.db.connections.idle`), not
on a database thread: a wave of requests larger than the kept connections stays on the
loop. A wait never loses a connection, and never waits on nothing: a caller cancelled, a
wait that outlasts ``LOOP_WAIT_SECONDS`` and the last connection out dropped each leave
the store as it was.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import zerda_store.db.connections.idle as kept_module
from tests.doubles import AsyncKeywordLLM, CountedThreads
from zerda_store import ConversationEntityMemory
from zerda_store.db.store import StoreCore

pytestmark = pytest.mark.postgres

PEOPLE = ["Sarah Chen", "Omar Haddad"]
RECALLED = "Previous information about Sarah Chen:\nSarah Chen renewed ok"
# A hang guard, not a measure: every wait here ends long before.
GUARD_SECONDS = 60


def _memory(store: StoreCore, session_id: str = "default") -> ConversationEntityMemory:
    return ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store, session_id=session_id)


def _filled(store: StoreCore, sessions: int = 1) -> None:
    memory = ConversationEntityMemory(AsyncKeywordLLM(PEOPLE), store=store, auto_migrate=True)
    for number in range(sessions):
        memory.session_id = "default" if number == 0 else f"s{number}"
        memory.save_context({"input": "Sarah Chen renewed"}, {"output": "ok"})


def _kept_everything(store: StoreCore) -> bool:
    """Every connection out of the pool is kept idle: none lent, none lost."""
    return store.connections_in_use() == 0 and len(store._kept) >= 1


@contextmanager
def _waiting(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, wait: float
) -> Iterator[tuple[StoreCore, CountedThreads]]:
    """A filled store with one connection kept (a pool of 2), loop waits of ``wait``
    seconds, and its database threads counted."""
    monkeypatch.setattr(kept_module, "LOOP_WAIT_SECONDS", wait)
    with StoreCore(postgres_url, async_pool_size=1) as store:
        _filled(store)
        yield store, CountedThreads(store, monkeypatch)


async def _recall(store: StoreCore) -> str:
    recalled = await _memory(store).aload_memory_variables({"input": "How is Sarah Chen?"})
    return str(recalled["entity_info"])


def test_a_wave_larger_than_the_kept_connections_stays_on_the_loop(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wave = 40
    with StoreCore(postgres_url, async_pool_size=1) as store:  # a pool of 2, 2 kept
        _filled(store, sessions=wave)
        threads = CountedThreads(store, monkeypatch)

        async def turns() -> tuple[list[str], list[Any]]:
            recalled = await asyncio.gather(*(_recall(store) for _ in range(wave)))
            saved = await asyncio.gather(
                *(
                    _memory(store, f"s{number}").asave_context(
                        {"input": "Omar Haddad called"}, {"output": "ok"}
                    )
                    for number in range(1, wave)
                )
            )
            return recalled, saved

        recalled, _ = asyncio.run(turns())
        assert (threads.reads, threads.writes) == (0, 0)
        assert set(recalled) == {RECALLED}
        for number in range(1, wave):
            stats = _memory(store, f"s{number}").get_memory_stats()
            assert stats["message_count"] == 2
        assert _kept_everything(store)


def test_a_caller_cancelled_while_waiting_loses_no_connection(postgres_url: str) -> None:
    with StoreCore(postgres_url, async_pool_size=1) as store:
        _filled(store)

        async def cancelled() -> None:
            held = await store.borrow_on_loop()  # the one kept connection, out
            assert held is not None
            waiting = asyncio.create_task(_recall(store))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # waiting for the connection held here
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            store.give_back(held, reusable=True)
            assert await asyncio.wait_for(_recall(store), GUARD_SECONDS) == RECALLED

        asyncio.run(cancelled())
        assert _kept_everything(store)


async def _handed_then_cancelled(store: StoreCore, then: Callable[[], None] = lambda: None) -> None:
    """A kept connection given back to a waiting unit that is cancelled before it runs;
    ``then`` runs between the cancellation and the waiter's end."""
    held = await store.borrow_on_loop()
    waiting = asyncio.create_task(store.borrow_on_loop())
    await asyncio.sleep(0.05)
    store.give_back(held, reusable=True)  # handed to the waiter, which has not run
    waiting.cancel()
    then()
    with pytest.raises(asyncio.CancelledError):
        await waiting


def test_a_connection_handed_over_as_its_waiter_is_cancelled_is_kept(postgres_url: str) -> None:
    with StoreCore(postgres_url, async_pool_size=1) as store:
        _filled(store)

        asyncio.run(_handed_then_cancelled(store))
        assert _kept_everything(store)
        assert asyncio.run(_recall(store)) == RECALLED  # the kept connection still serves


def test_a_wait_that_outlasts_its_limit_goes_to_a_thread(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _waiting(postgres_url, monkeypatch, 0.05) as (store, threads):

        async def outlasted() -> str:
            held = await store.borrow_on_loop()  # out for longer than a wait lasts
            try:
                return await asyncio.wait_for(_recall(store), GUARD_SECONDS)
            finally:
                store.give_back(held, reusable=True)

        assert asyncio.run(outlasted()) == RECALLED
        assert threads.reads == 1
        assert _kept_everything(store)


def test_a_connection_given_back_on_another_thread_reaches_the_waiting_loop(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _waiting(postgres_url, monkeypatch, GUARD_SECONDS) as (store, threads):

        async def from_another_thread() -> str:
            held = await store.borrow_on_loop()
            waiting = asyncio.create_task(_recall(store))
            await asyncio.sleep(0.05)
            giver = threading.Thread(
                target=store.give_back, args=(held,), kwargs={"reusable": True}
            )
            giver.start()
            try:
                return await asyncio.wait_for(waiting, GUARD_SECONDS)
            finally:
                giver.join()

        assert asyncio.run(from_another_thread()) == RECALLED
        assert threads.reads == 0
        assert _kept_everything(store)


def test_the_last_connection_out_dropped_sends_its_waiters_to_threads(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _waiting(postgres_url, monkeypatch, GUARD_SECONDS) as (store, threads):

        async def dropped() -> list[str]:
            held = await store.borrow_on_loop()
            waiting = [asyncio.create_task(_recall(store)) for _ in range(3)]
            await asyncio.sleep(0.05)
            held.invalidate()
            store.give_back(held, reusable=False)  # nothing left out to wait for
            return await asyncio.wait_for(asyncio.gather(*waiting), GUARD_SECONDS)

        assert asyncio.run(dropped()) == [RECALLED] * 3
        assert threads.reads >= 1
        assert store.connections_in_use() == 0


def test_a_cancelled_waiter_is_passed_over_when_the_last_connection_is_dropped(
    postgres_url: str,
) -> None:
    with StoreCore(postgres_url, async_pool_size=1) as store:
        _filled(store)

        async def cancelled_then_dropped() -> str:
            held = await store.borrow_on_loop()
            gone = asyncio.create_task(store.borrow_on_loop())
            waiting = asyncio.create_task(_recall(store))
            await asyncio.sleep(0.05)
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            held.invalidate()
            store.give_back(held, reusable=False)
            return await asyncio.wait_for(waiting, GUARD_SECONDS)

        assert asyncio.run(cancelled_then_dropped()) == RECALLED
        assert store.connections_in_use() == 0


def test_a_forked_child_does_not_wait_for_a_lock_its_parent_held(postgres_url: str) -> None:
    with StoreCore(postgres_url) as store:
        store.give_back(store.borrow(), reusable=True)
        with store._kept._lock:  # as another thread of the parent, inside the kept list
            pid = os.fork()
            if pid == 0:
                signal.alarm(GUARD_SECONDS)  # a hang guard: the child dies instead
                code = 1
                try:
                    store.give_back(store.borrow(), reusable=True)
                    code = 0
                finally:
                    os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_connection_its_cancelled_waiter_gives_back_after_close_is_not_kept(
    postgres_url: str,
) -> None:
    store = StoreCore(postgres_url, async_pool_size=1)
    _filled(store)

    asyncio.run(_handed_then_cancelled(store, then=store.close))
    assert len(store._kept) == 0
    assert store.engine.pool.checkedout() == 0


def test_a_connection_given_back_while_its_waiters_loop_is_stopped_stays_kept(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kept_module, "LOOP_WAIT_SECONDS", GUARD_SECONDS)
    with StoreCore(postgres_url, async_pool_size=1) as store:
        _filled(store)
        loop = asyncio.new_event_loop()

        async def leave_a_waiter() -> tuple[Any, asyncio.Task[Any]]:
            held = await store.borrow_on_loop()
            waiting = asyncio.create_task(store.borrow_on_loop())
            await asyncio.sleep(0.05)
            return held, waiting

        try:
            held, waiting = loop.run_until_complete(leave_a_waiter())  # then the loop stops
            store.give_back(held, reusable=True)  # from this thread, no loop running here
            assert store.connections_in_use() == 0  # kept, not in transit to the loop
            assert not store._kept._lent
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                loop.run_until_complete(waiting)
        finally:
            loop.close()
        assert asyncio.run(_recall(store)) == RECALLED
        assert _kept_everything(store)
