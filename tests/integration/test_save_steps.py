"""The sync and the async save run the same steps in the same order: the store checked
writable, the idempotency key's check, the idle prune, extraction, then what the store's
routes send (:mod:`zerda_store.db.routes`): the one trip, the unit of work, each statement
as the database gets it. Recorded through both on the same conversation, on each backend."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db import routes
from zerda_store.db.aio import loop_reads, loop_writes
from zerda_store.db.execution.driver import Cursor
from zerda_store.db.store import core_of

NAMES = ["Sarah Chen", "Dr. Sarah Chen", "Acme Corp", "Omar Haddad"]
START = 1_000_000.0
IDLE = 3_600.0


class Recorder(KeywordLLM):
    """The steps of the saves, in order: a mark for each check of the store, each call
    of the model, each statement run (its SQL) and each pipeline sent (its statements'
    SQL); with the thread each statement ran on."""

    def __init__(self) -> None:
        super().__init__(NAMES)
        self.steps: list[Any] = []
        self.threads: list[tuple[str, str]] = []

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        self.steps.append("extract")
        return super().generate(prompt, max_tokens)

    async def agenerate(self, prompt: str, max_tokens: int = 256) -> str:
        return self.generate(prompt, max_tokens)

    def mark(self, step: str) -> None:
        if not self.steps or self.steps[-1] != step:  # checked again further down: once
            self.steps.append(step)

    def statement(self, sql: str) -> None:
        self.steps.append(sql)
        self.threads.append((sql, threading.current_thread().name))


@contextmanager
def recording(store: Store, monkeypatch: pytest.MonkeyPatch, recorder: Recorder) -> Iterator[None]:
    core = core_of(store)  # what the memory's calls check, not the user's face
    check_writable = core.check_writable

    def checked() -> None:
        recorder.mark("writable?")
        check_writable()

    def on_cursor(name: str) -> Callable[..., Any]:
        method = getattr(Cursor, name)

        def recorded(self: Cursor, statement: Any, *args: Any) -> Any:
            recorder.statement(statement if isinstance(statement, str) else statement.sql)
            return method(self, statement, *args)

        return recorded

    pipelined = routes.write_pipelined

    def sent_pipeline(store: Any, steps: Any) -> Any:
        rows = pipelined(store, steps)
        recorder.steps.append(("pipeline", *(statement.sql for statement, _ in steps)))
        return rows

    loop_write = loop_writes.write

    async def sent_from_loop(store: Any, steps: Any, stored: Any) -> Any:
        rows = await loop_write(store, steps, stored)
        if not isinstance(rows, loop_writes.NotSent):
            recorder.steps.append(("pipeline", *(statement.sql for statement, _ in steps)))
        return rows

    loop_read = loop_reads.read

    async def read_from_loop(store: Any, work: Any) -> Any:
        before = len(recorder.steps)
        answer = await loop_read(store, work)
        if len(recorder.steps) == before and work.statement is not None:  # not on a thread
            recorder.statement(work.statement.sql)
        return answer

    with monkeypatch.context() as patch:
        patch.setattr(core, "check_writable", checked)
        for name in ("execute", "execute_count", "execute_many", "execute_sql"):
            patch.setattr(Cursor, name, on_cursor(name))
        patch.setattr(routes, "write_pipelined", sent_pipeline)
        patch.setattr(loop_writes, "write", sent_from_loop)
        patch.setattr(loop_reads, "read", read_from_loop)
        yield


def _turns() -> list[tuple[dict[str, str], dict[str, str], str | None]]:
    return [
        ({"input": "Sarah Chen joined Acme Corp"}, {"output": "noted"}, None),  # rules recorded
        ({"input": "Sarah Chen called"}, {"output": "ok"}, "k1"),  # one trip on Postgres
        ({"input": "Sarah Chen called"}, {"output": "ok"}, "k1"),  # a retry: stops at the check
        ({"input": "Dr. Sarah Chen wrote"}, {"output": "ok"}, None),  # a name to resolve
        ({"input": "Omar Haddad asked"}, {"output": "answered"}, "k2"),
    ]


def _memory(
    store: Store, session_id: str, recorder: Recorder, now: list[float]
) -> ConversationEntityMemory:
    memory = ConversationEntityMemory(
        recorder, store=store, session_id=session_id, clock=lambda: now[0]
    )
    memory.set_retention(session_idle=IDLE)
    return memory


def _sync_steps(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder, now = Recorder(), [START]
    with Store(database_url) as store:
        memory = _memory(store, "sync", recorder, now)
        with recording(store, monkeypatch, recorder):
            for inputs, outputs, key in _turns():
                memory.save_context(inputs, outputs, idempotency_key=key)
            now[0] += 2 * IDLE  # idle past its limit: the next save prunes first
            memory.save_context({"input": "Acme Corp again"}, {"output": "ok"})
    return recorder


def _async_steps(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder, now = Recorder(), [START]

    async def run(memory: ConversationEntityMemory) -> None:
        for inputs, outputs, key in _turns():
            await memory.asave_context(inputs, outputs, idempotency_key=key)
        now[0] += 2 * IDLE
        await memory.asave_context({"input": "Acme Corp again"}, {"output": "ok"})

    with Store(database_url) as store:
        memory = _memory(store, "async", recorder, now)
        with recording(store, monkeypatch, recorder):
            asyncio.run(run(memory))
    return recorder


def test_the_sync_and_async_saves_run_the_same_steps_in_the_same_order(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = _sync_steps(database_url, monkeypatch).steps
    awaited = _async_steps(database_url, monkeypatch)

    assert awaited.steps == sync
    assert sync.count("extract") == 5  # the retry stopped before extraction
    assert sync.index("writable?") < sync.index("extract")
    pipelines = [step for step in sync if isinstance(step, tuple)]
    if database_url.startswith("postgresql"):
        # Every turn after the first tried in one trip (Citus: one call run on the worker).
        assert len(pipelines) == 4
        delegated = all("zerda_save_turn_v1" in pipeline[-1] for pipeline in pipelines)
        assert delegated == routes_distributed(database_url)
    else:
        assert pipelines == []


def test_the_async_idle_prune_runs_on_the_stores_database_threads(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _async_steps(database_url, monkeypatch)
    deletes = [thread for sql, thread in recorder.threads if sql.lstrip().startswith("DELETE")]

    assert deletes, "the idle session was not pruned"
    assert all(thread.startswith("zerda-store-") for thread in deletes), deletes


def routes_distributed(database_url: str) -> bool:
    with Store(database_url) as store:
        return routes.Routes(core_of(store)).routed()
