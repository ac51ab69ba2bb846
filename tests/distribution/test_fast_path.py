"""Which of Citus's planners each hot statement takes (runs under ``scripts/test-citus`` only).

The coordinator reports its planning at ``client_min_messages = debug2``: a statement on one
distributed table filtered by ``session_id = $n`` once takes the fast-path router planner
("... for a fast-path router query": its plan is cached when prepared and its shard chosen
at execution); an ``INSERT ... VALUES`` is routed by its values without planning the rest;
anything else (a join, a ``UNION ALL``, a CTE, a ``LATERAL``) goes through the full router
planner: planned on the coordinator, deparsed, and planned again on the worker.

The test pins the statements that still take the full router planner, so that a hot
statement that leaves the fast path fails it, and one that joins it is noticed (the list
below shrinks; docs/citus.md, Cost)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from tests.citus import Cluster
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store

pytestmark = pytest.mark.citus

NAMES = ("Sarah Chen", "Acme Corp", "Berlin")
FAST_PATH = "for a fast-path router query"
# The hot statements that take the full router planner today, by how they begin: the
# save's read of the candidates a name may join (entities UNION ALL aliases), and the
# recall (a CTE of the candidates, UNION ALL, the snippets through a LATERAL join).
FULL_ROUTER = {
    "save": ["SELECT entities.name_key AS entity_key"],
    "recall": ["WITH candidates AS"],
}


@pytest.fixture
def url(citus_cluster: Cluster) -> Iterator[str]:
    found, drop = citus_cluster.new_database(distributed=True)
    yield found
    drop()


class Planning:
    """Each statement the coordinator parsed on the store's connections, with the planner
    messages that followed it."""

    def __init__(self, store: Store) -> None:
        self.statements: list[tuple[str, list[str]]] = []
        sa.event.listen(store.engine, "connect", self._listen)

    def _listen(self, dbapi_connection: psycopg.Connection, _record: object) -> None:
        dbapi_connection.add_notice_handler(self._notice)
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET client_min_messages = debug2")
        dbapi_connection.commit()

    def _notice(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        message = diagnostic.message_primary or ""
        if message.startswith("parse "):
            self.statements.append((message.split(": ", 1)[1], []))
        elif self.statements:
            self.statements[-1][1].append(message)

    def taken(self) -> list[tuple[str, list[str]]]:
        taken, self.statements = self.statements, []
        return taken


def planner(statement: str, messages: list[str]) -> str:
    """ "fast path", "insert" (routed by its values), "local" (no distributed table), or
    "router" (the full router planner)."""
    if any(FAST_PATH in message for message in messages):
        return "fast path"
    if statement.startswith("INSERT INTO") and " SELECT " not in statement:
        return "insert"
    if not any("router" in message or "distributed" in message for message in messages):
        return "local"
    return "router"


def routed_in_full(taken: list[tuple[str, list[str]]], known: list[str]) -> list[str]:
    """The statements the full router planner planned, each as the known beginning it
    has (or whole, if it has none)."""
    found = []
    for statement, messages in taken:
        if planner(statement, messages) == "router":
            found.append(next((k for k in known if statement.startswith(k)), statement))
    return found


def test_hot_statements_take_the_fast_path_but_the_known_router_reads(url: str) -> None:
    with Store(url) as store:
        planning = Planning(store)
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id="acme", store=store)
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
        memory.save_context({"input": "Sarah Chen in Berlin"}, {"output": "Noted"})
        planning.taken()  # the session's first saves also record its key rules
        memory.save_context(
            {"input": "Sarah Chen of Acme Corp"}, {"output": "Hi"}, idempotency_key="k"
        )
        saved = planning.taken()
        recalled = memory.load_memory_variables({"input": "Sarah Chen and Berlin?"})
        recall = planning.taken()
        memory.close()

    assert "Sarah Chen" in recalled[memory.memory_key]
    kinds = [planner(statement, messages) for statement, messages in saved]
    assert kinds.count("insert") == 4  # the turn, its entities, its snippets, its ledger row
    assert "fast path" in kinds  # the idempotency key's check
    assert routed_in_full(saved, FULL_ROUTER["save"]) == FULL_ROUTER["save"]
    assert routed_in_full(recall, FULL_ROUTER["recall"]) == FULL_ROUTER["recall"]
