"""Test doubles, driver hooks and fixtures shared by the suites: the stand-in models and
extractors, a clock, the counter of the store's database threads, driver hooks, fakes of the
memory's parts, the Postgres database helper, and the ``refused_port``, ``logs`` and
``clock`` fixtures (registered for every suite by tests/conftest.py)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from zerda_store.extraction import ExtractedEntity
from zerda_store.model.records import Mention, NewTurn, SessionStats

if TYPE_CHECKING:
    from zerda_store import Store


# -- stand-in models (an LLM: ``generate``, and ``agenerate`` when async) -------------------


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


class RecordingLLM:
    """Keeps every ``(prompt, max_tokens)`` it is asked with (``calls``); answers with a
    fixed text, or as the model it wraps answers."""

    def __init__(self, response: str | Any = "") -> None:
        self.response = response
        self.calls: list[tuple[str, int]] = []

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        self.calls.append((prompt, max_tokens))
        if isinstance(self.response, str):
            return self.response
        return str(self.response.generate(prompt, max_tokens))


class OutageLLM(KeywordLLM):
    """A keyword LLM that fails while ``down`` is set, like a provider during an outage."""

    def __init__(self, vocabulary: Iterable[str], *, down: bool = False) -> None:
        super().__init__(vocabulary)
        self.down = down

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        if self.down:
            raise TimeoutError("LLM did not answer in 30 s")
        return super().generate(prompt, max_tokens)


class ThreadRecordingLLM(KeywordLLM):
    """A sync keyword LLM that records the threads it ran on (``threads``)."""

    def __init__(self, vocabulary: Iterable[str]) -> None:
        super().__init__(vocabulary)
        self.threads: set[str] = set()

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        self.threads.add(threading.current_thread().name)
        return super().generate(prompt, max_tokens)


class AsyncOnlyLLM:
    """An async LLM with a fixed answer that keeps the prompts it is awaited with
    (``prompts``); a sync call fails the test."""

    def __init__(self, answer: str = "Sarah, Acme Corp, x") -> None:
        self.answer = answer
        self.prompts: list[str] = []

    def generate(self, prompt: str, max_tokens: int = 100) -> str:
        raise AssertionError("the async path must not call generate")

    async def agenerate(self, prompt: str, max_tokens: int = 100) -> str:
        self.prompts.append(prompt)
        return self.answer


class CanonicalLLM:
    """Wraps a keyword LLM and answers each name by its ``canonical`` form (the entity's
    first-seen spelling), each once."""

    def __init__(self, llm: KeywordLLM, canonical: Mapping[str, str]) -> None:
        self.llm = llm
        self.canonical = canonical

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        answer = self.llm.generate(prompt, max_tokens).split(", ")
        names = [self.canonical.get(n, n) for n in answer]
        return ", ".join(dict.fromkeys(n for n in names if n))


# -- stand-in extractors (an extraction service: ``name`` and ``extract(text)``) ----------


class NamesExtractor:
    """Extracts the given names whatever the text says; counts its calls (``calls``)."""

    name = "names"

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.calls = 0

    def extract(self, text: str) -> list[str]:
        self.calls += 1
        return list(self.names)


class VocabularyExtractor:
    """Extracts the known names that occur in the text, in order of first occurrence."""

    name = "vocabulary"

    def __init__(self, vocabulary: Sequence[str]) -> None:
        self.vocabulary = tuple(vocabulary)

    def extract(self, text: str) -> list[str]:
        found = [(text.find(name), name) for name in self.vocabulary if name in text]
        return [name for _, name in sorted(found)]


class LongestNames:
    """Extracts the known names in the text, in order, a name inside a longer one ("Sarah
    Chen" in "Dr. Sarah Chen") not on its own."""

    name = "longest-names"

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def extract(self, text: str) -> list[str]:
        found = [name for name in self.names if name in text]
        whole = [
            name for name in found if not any(name != other and name in other for other in found)
        ]
        return sorted(whole, key=text.find)


class ListedNames:
    """Extracts the names a turn's text lists first, as ``"Ada, Bo | the rest"``."""

    name = "listed"

    def extract(self, text: str) -> list[str]:
        return text.split(" | ", 1)[0].split(", ")


class TypedNames:
    """Extracts the names and types a turn's text lists first, as ``"Sarah/PERSON, Acme/ORG
    | the rest"`` (a name without a type is ``unknown``)."""

    name = "typed"

    def extract(self, text: str) -> list[ExtractedEntity]:
        head = text.split(" | ", 1)[0]
        found = []
        for part in head.split(", "):
            name, _, kind = part.partition("/")
            found.append(ExtractedEntity(name, kind or "unknown"))
        return found


class TypedExtractor:
    """Extracts the known names (case-sensitive) with their types, in order of first
    occurrence; raises while ``down`` is set, like a provider during an outage."""

    def __init__(self, types_by_name: Mapping[str, str], *, name: str = "typed") -> None:
        self.types_by_name = dict(types_by_name)
        self.name = name
        self.down = False

    def extract(self, text: str) -> list[tuple[str, str]]:
        if self.down:
            raise TimeoutError("extraction did not answer in 30 s")
        found = sorted((text.find(name), name) for name in self.types_by_name if name in text)
        return [(name, self.types_by_name[name]) for _, name in found]


class AnswerExtractor:
    """Gives the same answer, as it is, for every text (names, pairs, or anything odd)."""

    def __init__(self, answer: Any, name: str = "answer") -> None:
        self.answer = answer
        self.name = name

    def extract(self, text: str) -> Any:
        return self.answer


class ScriptedExtractor:
    """Gives the next prepared answer on each call."""

    name = "scripted"

    def __init__(self, answers: Iterable[Any]) -> None:
        self.answers = list(answers)

    def extract(self, text: str) -> Any:
        return self.answers.pop(0)


class RaisingExtractor:
    """Raises ``error`` for every text."""

    name = "raising"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def extract(self, text: str) -> list[str]:
        raise self.error


def stanza_document(*entities: tuple[str, str]) -> SimpleNamespace:
    """What a stanza pipeline returns for a text: its ``ents``, each a ``text`` and a
    ``type``."""
    return SimpleNamespace(
        ents=[SimpleNamespace(text=text, type=type_) for text, type_ in entities]
    )


# -- clocks, the store's threads, the driver ------------------------------------------------


class Clock:
    """An injectable clock: epoch seconds that move only when told (``now``)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountedThreads:
    """Counts the units of work a store hands to its database threads: ``reads``,
    ``writes``, and ``calls`` (both)."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        self.writes = 0
        for name, kind in (
            ("aread", "reads"),
            ("awrite", "writes"),
            ("awrite_in_one_trip", "writes"),
        ):
            monkeypatch.setattr(store, name, self._counted(getattr(store, name), kind))

    @property
    def calls(self) -> int:
        return self.reads + self.writes

    def _counted(
        self, method: Callable[..., Awaitable[Any]], kind: str
    ) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            setattr(self, kind, getattr(self, kind) + 1)
            return await method(*args, **kwargs)

        return counted


class DisconnectMessageDialect:
    """A dialect that tells a lost connection by its error's message only, as SQLAlchemy's
    dialects do (``is_disconnect``)."""

    def is_disconnect(self, error: BaseException, connection: Any, cursor: Any) -> bool:
        return "server closed the connection" in str(error)


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


# -- fakes of the memory's parts, for unit tests of the memory without a database ---------


class FakeStore:
    """The store as the memory uses it: writable, and closed once."""

    def __init__(self) -> None:
        self.closed = False

    def check_writable(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeRepository:
    """Keeps saved turns in a list and recalls each mentioned key's snippets."""

    resolver = None

    def __init__(self) -> None:
        self.turns: list[tuple[str, NewTurn]] = []
        self.recalls: list[tuple[str, list[str], int, Any]] = []

    def key_rules_check(self, session_id: str) -> None:
        """Nothing to run first: the fake's sessions take any key rules."""
        return None

    def has_turn(self, session_id: str, idempotency_key: str) -> bool:
        return any(turn.idempotency_key == idempotency_key for _, turn in self.turns)

    def save_turn(self, session_id: str, turn: NewTurn) -> int:
        self.turns.append((session_id, turn))
        return len(self.turns)

    def recall(
        self, session_id: str, mentions: list[Mention], limit: int, visible: Any = None
    ) -> list[tuple[str, list[str]]]:
        self.recalls.append((session_id, [m.key for m in mentions], limit, visible))
        recalled = []
        for mention in mentions:
            snippets = [
                turn.text
                for saved_in, turn in self.turns
                if saved_in == session_id and mention.key in {m.key for m in turn.mentions}
            ]
            recalled.append((mention.name, snippets[-limit:]))
        return recalled

    def stats(self, session_id: str, visible: Any = None) -> SessionStats:
        return SessionStats(0, len(self.turns), 0)


class NoPolicy:
    """A policy cache of a session without a retention policy."""

    def get(self) -> None:
        return None


# -- Postgres databases and fixtures (registered by tests/conftest.py) ----------------------

POSTGRES_ADMIN_URL = os.environ.get(
    "ZERDA_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def direct_url(url: str) -> str:
    """The URL of ``url``'s Postgres database on the test server itself, not through the run's
    pooler (``ZERDA_TEST_POOLER``), as SQLAlchemy takes it: for reading and changing a test's
    database beside the store. Any other URL as it is."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "postgresql" or "prepared_statements" not in parsed.query:
        return url
    server = sa.make_url(POSTGRES_ADMIN_URL)
    direct = parsed.set(host=server.host, port=server.port)
    return direct.difference_update_query(["prepared_statements"]).render_as_string(False)


def new_postgres_database(admin: sa.Engine) -> tuple[str, Callable[[], None]]:
    """A new, empty Postgres database made through ``admin``: its URL, and how to drop it."""
    name = f"zerda_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    url = sa.make_url(POSTGRES_ADMIN_URL).set(database=name)
    return url.render_as_string(hide_password=False), drop


@pytest.fixture
def refused_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens there once closed


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every record of SQLAlchemy and zerda_store, down to DEBUG."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="sqlalchemy")
    caplog.set_level(logging.DEBUG, logger="zerda_store")
    return caplog


@pytest.fixture
def clock() -> Callable[[], float]:
    """A memory clock that ticks 100 s per reading from 1000.0."""
    ticks = itertools.count(1000.0, 100.0)
    return lambda: next(ticks)


# -- reading and changing a database beside the store ------------------------------------


def query(database_url: str, sql: str, **params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of one statement, on a connection of its own."""
    engine = sa.create_engine(direct_url(database_url))
    try:
        with engine.connect() as connection:
            result = connection.execute(sa.text(sql), params)
            return list(result.keys()), [tuple(row) for row in result]
    finally:
        engine.dispose()


def execute(database_url: str, sql: str) -> None:
    engine = sa.create_engine(direct_url(database_url))
    try:
        with engine.begin() as connection:
            connection.execute(sa.text(sql))
    finally:
        engine.dispose()


def say(memory: Any, said: str, answered: str = "ok") -> None:
    """One turn: ``said`` in, ``answered`` out."""
    memory.save_context({"input": said}, {"output": answered})
