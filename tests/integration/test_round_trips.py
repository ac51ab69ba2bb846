"""Postgres: a save and a recall each cost one round trip to the server, the session's
lock and name resolution included.

Round trips are counted in libpq's own trace of the protocol: the client waits for the
server once per ``ReadyForQuery`` message (the answer to a sync, or to a simple query)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from typing import IO, Any

import pytest
from psycopg import pq
from sqlalchemy import event

from tests.doubles import LongestNames
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.store import core_of

pytestmark = pytest.mark.postgres

NAMES = [
    *["Sarah Chen", "Dr. Sarah Chen", "Omar Haddad", "Dr. Lina Nasser", "Lina Nasser", "Karim"],
    *["Acme Corp", "Acme Inc."],
]


class ProtocolTrace:
    """libpq's trace of every connection a store opens, read and cleared on demand."""

    def __init__(self, store: Store) -> None:
        self._traced: list[tuple[Any, IO[bytes]]] = []
        event.listen(store.engine, "connect", self._trace)
        core_of(store).drop_connections()  # connections opened from now on are traced

    def _trace(self, driver_connection: Any, _record: Any) -> None:
        sink = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self._traced.append((driver_connection, sink))
        self._start(driver_connection, sink)

    @staticmethod
    def _start(driver_connection: Any, sink: IO[bytes]) -> None:
        driver_connection.pgconn.trace(sink.fileno())
        driver_connection.pgconn.set_trace_flags(
            pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE
        )

    def take(self) -> str:
        """What every traced connection sent and received since the last call."""
        text = []
        for driver_connection, sink in self._traced:
            if driver_connection.closed:
                continue
            driver_connection.pgconn.untrace()  # flushes libpq's buffer into the file
            sink.seek(0)
            text.append(sink.read().decode("utf-8", "replace"))
            sink.seek(0)
            sink.truncate()
            self._start(driver_connection, sink)
        return "".join(text)

    def close(self) -> None:
        for _driver_connection, sink in self._traced:
            sink.close()


def round_trips(trace: str) -> int:
    return sum(1 for line in trace.splitlines() if line.split("\t")[2:3] == ["ReadyForQuery"])


@pytest.fixture
def traced(postgres_url: str) -> Iterator[tuple[ConversationEntityMemory, ProtocolTrace]]:
    store = Store(postgres_url)
    memory = ConversationEntityMemory(
        extractor=LongestNames(NAMES), store=store, session_id="trips"
    )
    trace = ProtocolTrace(store)
    # A session's first save in a process also checks and records its key rules.
    memory.save_context({"input": "Omar Haddad called."}, {"output": "Noted."})
    trace.take()
    yield memory, trace
    memory.close()
    store.close()
    trace.close()


def _save(memory: ConversationEntityMemory, text: str, **options: Any) -> None:
    memory.save_context({"input": text}, {"output": "Noted."}, **options)


def _recall(memory: ConversationEntityMemory, text: str) -> str:
    return str(memory.load_memory_variables({"input": text})["entity_info"])


def test_a_save_is_one_round_trip_with_the_session_lock(
    traced: tuple[ConversationEntityMemory, ProtocolTrace],
) -> None:
    memory, trace = traced
    _save(memory, "[1] Sarah Chen and Omar Haddad met.")
    sent = trace.take()
    assert round_trips(sent) == 1
    assert "pg_advisory_xact_lock_shared" in sent
    _save(memory, "[2] Karim asked Sarah Chen.")
    assert round_trips(trace.take()) == 1
    assert [turn["entities"] for turn in memory.chat_memory] == [
        ["Omar Haddad"],
        ["Sarah Chen", "Omar Haddad"],
        ["Karim", "Sarah Chen"],
    ]
    assert memory.get_memory_stats()["total_contexts"] == 5


def test_a_keyed_save_reads_its_key_first_then_saves_in_one_round_trip(
    traced: tuple[ConversationEntityMemory, ProtocolTrace],
) -> None:
    memory, trace = traced
    _save(memory, "[1] Sarah Chen", idempotency_key="m-1")
    assert round_trips(trace.take()) == 2
    _save(memory, "[1] Sarah Chen", idempotency_key="m-1")  # a delivery again: no model call
    assert round_trips(trace.take()) == 1
    assert len(memory.chat_memory) == 2


@pytest.mark.parametrize(
    "question",
    ["Sarah Chen?", "Someone new and Sarah Chen?", "Dr. Sarah Chen?", "Karim?"],
)
def test_a_recall_is_one_round_trip_whatever_its_names(
    traced: tuple[ConversationEntityMemory, ProtocolTrace], question: str
) -> None:
    memory, trace = traced
    _save(memory, "[1] Sarah Chen signed.")
    _save(memory, "[2] Dr. Sarah Chen called back.")  # joins Sarah Chen, as an alias
    trace.take()
    recalled = _recall(memory, question)
    assert round_trips(trace.take()) == 1
    if "Sarah" in question:
        assert "[1] Sarah Chen signed." in recalled
        assert "[2] Dr. Sarah Chen called back." in recalled
    else:
        assert recalled == ""


def test_a_save_whose_names_join_other_entities_still_joins_them(
    traced: tuple[ConversationEntityMemory, ProtocolTrace],
) -> None:
    """The single statement writes nothing when a bare name may join a titled entity;
    the general unit of work then resolves it."""
    memory, trace = traced
    _save(memory, "[1] Dr. Lina Nasser called.")
    _save(memory, "[2] Lina Nasser wrote.")
    assert round_trips(trace.take()) > 2
    assert memory.list_entities() == ["Omar Haddad", "Dr. Lina Nasser"]
    info = memory.get_entity_info("Lina Nasser")
    assert info is not None
    assert info["contexts_count"] == 2
    _save(memory, "[3] Lina Nasser again.")  # by the alias the join recorded
    assert memory.list_entities() == ["Omar Haddad", "Dr. Lina Nasser"]
    info = memory.get_entity_info("Dr. Lina Nasser")
    assert info is not None
    assert info["contexts_count"] == 3


def test_a_titled_mention_joins_and_the_bare_name_stays_one_round_trip(
    traced: tuple[ConversationEntityMemory, ProtocolTrace],
) -> None:
    memory, trace = traced
    _save(memory, "[1] Sarah Chen signed.")
    _save(memory, "[2] Dr. Sarah Chen called back.")  # the general unit of work: an alias
    assert memory.list_entities() == ["Omar Haddad", "Sarah Chen"]
    info = memory.get_entity_info("Dr. Sarah Chen")
    assert info is not None
    assert info["aliases"] == ["Dr. Sarah Chen"]
    trace.take()
    _save(memory, "[3] Sarah Chen paid.")  # its alias names the entity itself
    assert round_trips(trace.take()) == 1
    info = memory.get_entity_info("Sarah Chen")
    assert info is not None
    assert info["contexts_count"] == 3


@pytest.mark.parametrize("name", ["Dr. Sarah Chen", "Acme Corp"])
def test_a_titled_name_of_its_own_is_one_round_trip(
    traced: tuple[ConversationEntityMemory, ProtocolTrace], name: str
) -> None:
    """A title or a legal form needs no resolution when no other entity has its core: the
    save is the one statement, first time and after."""
    memory, trace = traced
    _save(memory, f"[1] {name} signed.")
    assert round_trips(trace.take()) == 1
    _save(memory, f"[2] {name} and Omar Haddad met.")
    assert round_trips(trace.take()) == 1
    assert memory.list_entities() == ["Omar Haddad", name]
    info = memory.get_entity_info(name)
    assert info is not None
    assert (info["contexts_count"], info["aliases"]) == (2, [])


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("Sarah Chen", "Dr. Sarah Chen"),  # a titled form of a bare name
        ("Dr. Sarah Chen", "Sarah Chen"),  # a bare name of a titled one
        ("Acme Corp", "Acme Inc."),  # another legal form of the same core
    ],
)
def test_a_name_whose_core_another_entity_has_still_joins_it(
    traced: tuple[ConversationEntityMemory, ProtocolTrace], first: str, then: str
) -> None:
    memory, trace = traced
    _save(memory, f"[1] {first} signed.")
    trace.take()
    _save(memory, f"[2] {then} called back.")
    assert round_trips(trace.take()) > 1  # the general unit of work resolved it
    assert memory.list_entities() == ["Omar Haddad", first]
    info = memory.get_entity_info(first)
    assert info is not None
    assert (info["contexts_count"], info["aliases"]) == (2, [then])


def test_an_async_save_is_one_round_trip_as_the_sync_one(
    traced: tuple[ConversationEntityMemory, ProtocolTrace],
) -> None:
    """The async save sends the same pipeline (from the event loop, or on a database
    thread); a turn whose names join another entity falls back to the general unit of
    work on a thread."""
    memory, trace = traced

    async def saves() -> list[int]:
        trips = []
        for text, key in [
            ("[1] Sarah Chen and Omar Haddad met.", None),
            ("[2] Karim asked Sarah Chen.", "m-2"),
            ("[2] Karim asked Sarah Chen.", "m-2"),  # a delivery again
        ]:
            await memory.asave_context({"input": text}, {"output": "Noted."}, idempotency_key=key)
            trips.append(round_trips(trace.take()))
        await memory.asave_context({"input": "[3] Dr. Lina Nasser called."}, {"output": "ok"})
        await memory.asave_context({"input": "[4] Lina Nasser wrote."}, {"output": "ok"})
        trips.append(round_trips(trace.take()))
        return trips

    trips = asyncio.run(saves())
    assert trips[:3] == [1, 2, 1]
    assert trips[3] > 2
    assert memory.list_entities() == ["Omar Haddad", "Sarah Chen", "Karim", "Dr. Lina Nasser"]
    info = memory.get_entity_info("Lina Nasser")
    assert info is not None and info["contexts_count"] == 2
