"""How the async path runs its units of work, on both backends: one store serves several
event loops at once and closing it closes every connection it opened; a unit of work runs
whole without the event loop (a busy loop cannot hold a transaction open); a cancelled
save is stored only when the cancellation came after its COMMIT was sent, and then the
caller is told; async calls beyond the store's pool fail with :class:`PoolExhaustedError`
instead of waiting without end; closing the store stops its async calls' threads.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import AsyncKeywordLLM
from zerda_store import (
    CancelledAfterCommitError,
    CommitOutcomeUnknownError,
    ConversationEntityMemory,
    PoolExhaustedError,
    StoreError,
)
from zerda_store.db import routes
from zerda_store.db.aio import loop_writes
from zerda_store.db.execution.driver import compile_statement
from zerda_store.db.execution.unit_of_work import Transaction
from zerda_store.db.store import StoreCore

# Only a guard, so that a call that waits forever fails the test instead of hanging it.
HANG_GUARD_SECONDS = 60
LOOP_TURNS = 15
CANCELLED_CALLS = 160


def _scalar(database_url: str, sql: str, **values: Any) -> Any:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.execute(sa.text(sql), values).scalar_one()
    finally:
        engine.dispose()


def _on_threads_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Postgres: async saves go to the database threads, never from the event loop
    (:mod:`db.loop_writes`), so that these tests see the thread path's rules."""

    async def not_sent(*_: Any) -> loop_writes.NotSent:
        return loop_writes.NOT_SENT

    monkeypatch.setattr(loop_writes, "write", not_sent)


def closed_connections(database_url: str) -> bool:
    """Whether no connection to the test's database is left besides the one asking. A
    Postgres backend whose client has hung up leaves ``pg_stat_activity`` a moment later,
    on its own time: that is waited for (at most ``HANG_GUARD_SECONDS``)."""
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while open_connections(database_url):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def open_connections(database_url: str) -> int:
    """Connections to the test's database besides the one asking: server sessions on
    Postgres; on SQLite, this process's open files of the database."""
    url = sa.make_url(database_url)
    if url.get_backend_name() == "postgresql":
        return int(
            _scalar(
                database_url,
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
        )
    path = Path(str(url.database)).resolve()
    opened = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        opened += target == str(path)
    return opened


# -- one store, several event loops -------------------------------------------------------


def _close(store: StoreCore) -> None:
    store.close()


def _aclose(store: StoreCore) -> None:
    asyncio.run(store.aclose())


@pytest.mark.parametrize("close", [_close, _aclose], ids=["close", "aclose"])
def test_one_store_serves_two_event_loops_at_once_and_closing_it_closes_every_connection(
    database_url: str, close: Callable[[StoreCore], None]
) -> None:
    store = StoreCore(database_url)
    counts: dict[str, int] = {}
    errors: list[BaseException] = []

    def in_its_own_loop(session: str) -> None:
        async def turns() -> int:
            memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id=session)
            for i in range(LOOP_TURNS):
                await asyncio.gather(
                    *(
                        memory.asave_context({"input": f"Sarah {i}.{j}"}, {"output": "ok"})
                        for j in range(4)
                    ),
                    memory.aload_memory_variables({"input": "Sarah?"}),
                )
            return int((await memory.aget_memory_stats())["message_count"])

        try:
            counts[session] = asyncio.run(turns())
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=in_its_own_loop, args=(s,), daemon=True) for s in ("one", "two")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD_SECONDS)
    assert not any(thread.is_alive() for thread in threads), "a loop still waits"
    assert errors == []
    assert counts == {"one": 4 * LOOP_TURNS, "two": 4 * LOOP_TURNS}
    assert open_connections(database_url) > 0  # the store's, until it is closed
    close(store)
    assert closed_connections(database_url)


@pytest.mark.asyncio
async def test_closing_the_store_stops_its_async_threads_and_refuses_later_async_calls(
    database_url: str,
) -> None:
    before = set(threading.enumerate())
    store = StoreCore(database_url)
    assert await store.awrite(lambda transaction: "written") == "written"
    assert await store.aread(lambda transaction: "read") == "read"
    assert store.llm_executor.submit(lambda: "extracted").result() == "extracted"
    made = [
        thread
        for thread in set(threading.enumerate()) - before
        if thread.name.startswith("zerda-store-")
    ]
    assert {thread.name.split("_")[0] for thread in made} >= {"zerda-store-db", "zerda-store-llm"}

    await store.aclose()

    for thread in made:
        thread.join(HANG_GUARD_SECONDS)
    assert not [thread.name for thread in made if thread.is_alive()]
    assert closed_connections(database_url)
    with pytest.raises(StoreError, match="closed"):
        await store.aread(lambda transaction: "read")
    with pytest.raises(StoreError, match="closed"):
        store.llm_executor  # noqa: B018 - the property is what refuses


# -- a unit of work runs whole, without the event loop -----------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["read", "snapshot read", "write"])
async def test_a_unit_of_work_runs_to_its_end_while_the_event_loop_is_busy(
    database_url: str, kind: str
) -> None:
    started, finished = threading.Event(), threading.Event()
    async with StoreCore(database_url) as store:
        select = compile_statement(sa.text("SELECT 1 AS one"), store.engine.dialect)

        def work(transaction: Transaction) -> int:
            transaction.run(select)
            started.set()
            for _ in range(3):
                transaction.run(select)
            finished.set()
            return 1

        if kind == "write":
            unit = asyncio.ensure_future(store.awrite(work))
        else:
            unit = asyncio.ensure_future(store.aread(work, snapshot=kind == "snapshot read"))
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while not started.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        # The event loop is busy (blocked here) between the transaction's statements: the
        # transaction must not need it to go on.
        assert finished.wait(HANG_GUARD_SECONDS), "the transaction waited for the event loop"
        assert await unit == 1


def _idle_in_transaction(database_url: str) -> int:
    if not database_url.startswith("postgresql"):
        return 0
    return int(
        _scalar(
            database_url,
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
        )
    )


@pytest.mark.asyncio
async def test_saves_end_and_give_their_connections_back_while_the_event_loop_is_busy(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory's saves on the database threads, started and then left without the
    event loop (blocked here): each runs to its COMMIT and gives its connection back, and
    no connection sits idle in transaction (Postgres), however long the loop stays busy.
    (A save sent from the event loop: ``test_loop_writes.py``.)"""
    async with StoreCore(database_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="busy")
        await memory.asave_context({"input": "Sarah"}, {"output": "ok"})  # key rules recorded
        _on_threads_only(monkeypatch)
        saves = [
            asyncio.ensure_future(
                memory.asave_context({"input": f"Sarah and Omar {n}"}, {"output": "ok"})
            )
            for n in range(20)
        ]
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while not store.connections_in_use() and time.monotonic() < deadline:
            await asyncio.sleep(0)  # until a save's unit of work runs
        assert store.connections_in_use(), "no save reached its unit of work"
        while store.connections_in_use() and time.monotonic() < deadline:
            time.sleep(0.01)  # the loop stays blocked
        assert store.connections_in_use() == 0, "a unit of work waited for the event loop"
        assert _idle_in_transaction(database_url) == 0
        await asyncio.gather(*saves)
        assert (await memory.aget_memory_stats())["message_count"] == 21


@pytest.mark.asyncio
async def test_on_sqlite_a_turn_hands_only_its_write_to_a_thread(sqlite_url: str) -> None:
    """SQLite: the recall and the idempotency key's check run on the event loop (less CPU
    than a hand-off); the save goes to the store's writer thread."""
    before = set(threading.enumerate())
    async with StoreCore(sqlite_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="loop")
        await memory.asave_context({"input": "Sarah"}, {"output": "ok"})  # key rules recorded
        for n in range(3):
            await memory.aload_memory_variables({"input": "Sarah?"})
            await memory.asave_context(
                {"input": f"Sarah {n}"}, {"output": "ok"}, idempotency_key=f"k{n}"
            )
        made = set(threading.enumerate()) - before
        names = {thread.name.split("_")[0] for thread in made}
        assert "zerda-store-sqlite-writer" in names
        assert "zerda-store-db" not in names
        assert (
            "Sarah 2 ok"
            in (await memory.aload_memory_variables({"input": "Sarah?"}))["entity_info"]
        )


# -- cancellation --------------------------------------------------------------------------


def _stored_keys(database_url: str, session: str) -> set[str]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT idempotency_key FROM turns WHERE session_id = :s"), {"s": session}
            )
            return {row[0] for row in rows if row[0] is not None}
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_a_cancelled_save_is_stored_only_when_the_caller_is_told(database_url: str) -> None:
    """Saves under ``wait_for`` with timeouts from 0 to twice a save's latency, four at a
    time: a call that timed out stored nothing; one that raised CommitOutcomeUnknownError
    (cancelled after its COMMIT was sent) may be stored; one that returned is stored."""
    async with StoreCore(database_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="cancel")
        began = time.monotonic()
        for n in range(10):
            await memory.asave_context({"input": f"Sarah warm-up {n}"}, {"output": "ok"})
        latency = (time.monotonic() - began) / 10

        outcomes: dict[str, str] = {}

        async def save(n: int) -> None:
            key = f"call-{n}"
            timeout = 2 * latency * (n % 40) / 40
            try:
                await asyncio.wait_for(
                    memory.asave_context(
                        {"input": f"Sarah and Omar, call {n}"},
                        {"output": "ok"},
                        idempotency_key=key,
                    ),
                    timeout,
                )
                outcomes[key] = "returned"
            except TimeoutError:
                outcomes[key] = "cancelled"
            except CommitOutcomeUnknownError:
                outcomes[key] = "told"

        for first in range(0, CANCELLED_CALLS, 4):
            await asyncio.gather(*(save(n) for n in range(first, first + 4)))
        assert store.connections_in_use() == 0

    stored = _stored_keys(database_url, "cancel")
    cancelled = {key for key, outcome in outcomes.items() if outcome == "cancelled"}
    returned = {key for key, outcome in outcomes.items() if outcome == "returned"}
    assert cancelled and returned  # the timeouts reached both sides of the commit
    assert cancelled & stored == set(), "cancelled calls that were stored anyway"
    assert returned <= stored


@pytest.mark.asyncio
async def test_a_save_cancelled_while_its_commit_runs_reports_it_stored(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    committing, go_on = threading.Event(), threading.Event()

    async with StoreCore(database_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="late")
        dialect = store.engine.dialect
        commit = dialect.do_commit

        def slow_commit(connection: Any) -> None:
            committing.set()
            go_on.wait(HANG_GUARD_SECONDS)
            commit(connection)

        monkeypatch.setattr(dialect, "do_commit", slow_commit)
        task = asyncio.ensure_future(
            memory.asave_context({"input": "Sarah"}, {"output": "ok"}, idempotency_key="m1")
        )
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while not committing.is_set() and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.001)
        assert committing.is_set(), "the save's COMMIT never ran"
        task.cancel()
        await asyncio.sleep(0.01)
        go_on.set()
        with pytest.raises(CommitOutcomeUnknownError, match="stored"):
            await task
    assert _stored_keys(database_url, "late") == {"m1"}


@pytest.mark.asyncio
@pytest.mark.parametrize("cancellations", [2, 3])
async def test_a_save_cancelled_again_while_its_commit_runs_reports_it_stored(
    database_url: str, monkeypatch: pytest.MonkeyPatch, cancellations: int
) -> None:
    """A second cancellation while the caller waits for the COMMIT it could not stop (a
    client that gives up twice, a ``wait_for`` inside a ``timeout``) still tells the
    caller the turn is stored: CancelledAfterCommitError, never a plain CancelledError."""
    committing, go_on = threading.Event(), threading.Event()

    async with StoreCore(database_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="twice")
        dialect = store.engine.dialect
        commit = dialect.do_commit

        def slow_commit(connection: Any) -> None:
            committing.set()
            go_on.wait(HANG_GUARD_SECONDS)
            commit(connection)

        monkeypatch.setattr(dialect, "do_commit", slow_commit)
        task = asyncio.ensure_future(
            memory.asave_context({"input": "Sarah"}, {"output": "ok"}, idempotency_key="t1")
        )
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while not committing.is_set() and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.001)
        assert committing.is_set(), "the save's COMMIT never ran"
        for _ in range(cancellations):
            task.cancel()
            await asyncio.sleep(0.01)
        go_on.set()
        with pytest.raises(CancelledAfterCommitError, match="stored"):
            await task
    assert _stored_keys(database_url, "twice") == {"t1"}


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_a_save_cancelled_while_its_one_trip_pipeline_runs_reports_it_stored(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Postgres: a save sent as one pipeline commits with the pipeline's answer; a
    cancellation that arrives once it is sent cannot stop it, and the caller is told."""
    sent, go_on = threading.Event(), threading.Event()

    async with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="piped")
        await memory.asave_context({"input": "Sarah"}, {"output": "ok"})  # key rules recorded
        _on_threads_only(monkeypatch)
        pipelined = routes.write_pipelined

        def slow_answer(*args: Any) -> Any:
            rows = pipelined(*args)
            sent.set()
            go_on.wait(HANG_GUARD_SECONDS)
            return rows

        monkeypatch.setattr(routes, "write_pipelined", slow_answer)
        task = asyncio.ensure_future(
            memory.asave_context({"input": "Sarah again"}, {"output": "ok"}, idempotency_key="p1")
        )
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while not sent.is_set() and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.sleep(0.01)
        go_on.set()
        assert sent.is_set(), "the save was not sent as one pipeline"
        with pytest.raises(CommitOutcomeUnknownError, match="stored"):
            await task
    assert _stored_keys(postgres_url, "piped") == {"p1"}


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_a_save_cancelled_while_it_decides_on_one_trip_is_not_stored(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Postgres: before a save is sent as one pipeline it may read (whether the tables are
    distributed, once a store); a cancellation that arrives then still stops it."""
    deciding, go_on = threading.Event(), threading.Event()

    async with StoreCore(postgres_url) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="early")
        await memory.asave_context({"input": "Sarah"}, {"output": "ok"})  # key rules recorded
        _on_threads_only(monkeypatch)
        decide = routes.Routes.route

        def slow_decision(self: Any, *args: Any, may_read: bool = True) -> Any:
            if may_read:  # on the database thread
                deciding.set()
                go_on.wait(HANG_GUARD_SECONDS)
            return decide(self, *args, may_read=may_read)

        monkeypatch.setattr(routes.Routes, "route", slow_decision)
        task = asyncio.ensure_future(
            memory.asave_context({"input": "Sarah again"}, {"output": "ok"}, idempotency_key="e1")
        )
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while not deciding.is_set() and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.001)
        assert deciding.is_set(), "the save did not decide on one trip"
        task.cancel()
        await asyncio.sleep(0.01)
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert _stored_keys(postgres_url, "early") == set()


# -- more calls than the pool serves --------------------------------------------------------


@pytest.mark.asyncio
async def test_async_calls_beyond_the_pool_fail_naming_its_size(database_url: str) -> None:
    holding, release = threading.Event(), threading.Event()

    def hold(_: Transaction) -> bool:
        holding.set()
        return release.wait(HANG_GUARD_SECONDS)

    async with StoreCore(database_url, async_pool_size=1, pool_timeout=0.3) as store:
        memory = ConversationEntityMemory(AsyncKeywordLLM(), store=store, session_id="full")
        await memory.asave_context({"input": "Sarah"}, {"output": "ok"})
        busy = asyncio.ensure_future(store.awrite(hold))
        while not holding.is_set():  # the store's one database thread (for writes) is taken
            await asyncio.sleep(0.001)
        try:
            with pytest.raises(PoolExhaustedError) as caught:
                await memory.asave_context({"input": "Sarah again"}, {"output": "ok"})
        finally:
            release.set()
            assert await busy
        message = str(caught.value)
        assert "async_pool_size=1" in message and "\n" not in message
        recalled = await memory.aload_memory_variables({"input": "Sarah?"})
        assert "Sarah ok" in recalled["entity_info"]
