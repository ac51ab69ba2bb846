"""Test doubles and driver hooks shared by the suites."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa


class KeywordLLM:
    """A stand-in LLM: answers with the known names that occur in the prompt's text, in
    order of first occurrence, comma-separated, like a well-behaved extraction model."""

    def __init__(self, vocabulary: Iterable[str], *, extra: str = "") -> None:
        self.vocabulary = sorted(set(vocabulary), key=len, reverse=True)
        self.extra = extra
        self.calls = 0
        self._lock = threading.Lock()

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        with self._lock:
            self.calls += 1
        found: list[tuple[int, str]] = []
        taken: list[range] = []
        for name in self.vocabulary:
            for match in re.finditer(re.escape(name), prompt):
                span = range(match.start(), match.end())
                if not any(span.start < t.stop and t.start < span.stop for t in taken):
                    taken.append(span)
                    found.append((match.start(), name))
        names: list[str] = []
        for _, name in sorted(found):
            if name not in names:
                names.append(name)
        return ", ".join(names) + self.extra


ASYNC_NAMES = ("Sarah", "Acme Corp", "Berlin", "Omar")


class AsyncKeywordLLM(KeywordLLM):
    """KeywordLLM with only an async ``agenerate``; records the threads it ran on."""

    def __init__(self, vocabulary: Iterable[str] = ASYNC_NAMES, *, delay: float = 0.0) -> None:
        super().__init__(vocabulary)
        self.delay = delay
        self.threads: set[str] = set()
        self.sync_calls = 0

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        self.sync_calls += 1
        return super().generate(prompt, max_tokens)

    async def agenerate(self, prompt: str, max_tokens: int = 256) -> str:
        self.threads.add(threading.current_thread().name)
        if self.delay:
            await asyncio.sleep(self.delay)
        return super().generate(prompt, max_tokens)


class FixedLLM:
    """Always gives the same answer, like the original documentation's example model."""

    def __init__(self, response: str) -> None:
        self.response = response
        self.calls = 0

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        self.calls += 1
        return self.response


class BrokenLLM:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error or RuntimeError("timeout")
        self.calls = 0

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        self.calls += 1
        raise self.error


@contextmanager
def driver_calls(
    engine: sa.Engine,
    *,
    before_statement: Callable[[Any, str, Any], None] | None = None,
    before_commit: Callable[[Any], None] | None = None,
) -> Iterator[list[tuple[str, Any]]]:
    """Every statement the engine's dialect hands to the driver inside the block, with its
    parameters: both SQLAlchemy's execution and zerda_store's compiled hot path call the
    dialect's ``do_execute`` and ``do_commit``. ``before_statement(cursor, statement,
    parameters)`` and ``before_commit(pooled_connection)`` run first and may raise, to
    inject a fault at that point."""
    dialect = engine.dialect
    sent: list[tuple[str, Any]] = []
    execute, execute_many, execute_no_params, commit = (
        dialect.do_execute,
        dialect.do_executemany,
        dialect.do_execute_no_params,
        dialect.do_commit,
    )

    def seen(cursor: Any, statement: str, parameters: Any) -> None:
        sent.append((statement, parameters))
        if before_statement is not None:
            before_statement(cursor, statement, parameters)

    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        seen(cursor, statement, parameters)
        execute(cursor, statement, parameters, context)

    def do_executemany(cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        seen(cursor, statement, parameters)
        execute_many(cursor, statement, parameters, context)

    def do_execute_no_params(cursor: Any, statement: str, context: Any = None) -> None:
        seen(cursor, statement, None)
        execute_no_params(cursor, statement, context)

    def do_commit(connection: Any) -> None:
        if before_commit is not None:
            before_commit(connection)
        commit(connection)

    hooks = {
        "do_execute": do_execute,
        "do_executemany": do_executemany,
        "do_execute_no_params": do_execute_no_params,
        "do_commit": do_commit,
    }
    own = {name: vars(dialect)[name] for name in hooks if name in vars(dialect)}
    for name, hook in hooks.items():
        setattr(dialect, name, hook)
    try:
        yield sent
    finally:
        for name in hooks:
            if name in own:
                setattr(dialect, name, own[name])
            else:
                delattr(dialect, name)
