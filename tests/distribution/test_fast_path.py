"""Which of Citus's planners each hot statement takes (runs under ``scripts/test-citus`` only).

The coordinator reports its planning at ``client_min_messages = debug2``: a statement on one
distributed table filtered by ``session_id = $n`` once takes the fast-path router planner
("... for a fast-path router query": its plan is cached when prepared and its shard chosen
at execution); an ``INSERT ... VALUES`` is routed by its values without planning the rest;
anything else (a join, a ``UNION ALL``, a CTE, a ``LATERAL``) goes through the full router
planner: planned on the coordinator, deparsed, and planned again on the worker. A call of a
distributed function whose session argument is known is sent whole to the worker that holds
the session's shard ("pushing down the function call").

A save and a recall are each one such call (``turns.delegated``); inside the functions, on
the worker, every statement on a distributed table takes the fast path or is an ``INSERT
... VALUES``. The tests fail when a hot statement leaves either (docs/citus.md, Cost).

"""

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
DELEGATED = "pushing down the function call"
ROUTER_PLAN = "Creating router plan"


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
    """ "delegated" (a function call sent whole to a worker), "fast path", "insert" (routed
    by its values), "local" (no distributed table), or "router" (the full router planner)."""
    if any(DELEGATED in message for message in messages):
        return "delegated"
    if any(FAST_PATH in message for message in messages):
        return "fast path"
    if statement.startswith("INSERT INTO") and " SELECT " not in statement:
        return "insert"
    if not any("router" in message or "distributed" in message for message in messages):
        return "local"
    return "router"


def test_a_save_and_a_recall_are_each_one_call_run_on_the_sessions_worker(url: str) -> None:
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
    kinds = {statement: planner(statement, messages) for statement, messages in saved}
    calls = [statement for statement, kind in kinds.items() if kind == "delegated"]
    assert len(calls) == 1 and "zerda_save_turn_v1(" in calls[0]
    assert set(kinds.values()) <= {"delegated", "fast path", "local"}  # the key's check
    [(statement, messages)] = [taken for taken in recall if planner(*taken) != "local"]
    assert "zerda_recall_v1(" in statement
    assert planner(statement, messages) == "delegated"


def test_inside_the_functions_every_statement_is_planned_for_one_shard(
    url: str, citus_cluster: Cluster
) -> None:
    """Each function run on the worker that holds the session's shard, as Citus runs a
    delegated call there: the save's three reads and the recall's each take the fast path,
    its four writes are ``INSERT ... VALUES``; nothing is planned in parts."""
    with Store(url) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id="acme", store=store)
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
        with store.connect() as connection:
            port = connection.execute(
                sa.text(
                    "SELECT nodeport FROM citus_shards WHERE table_name = 'turns'::regclass "
                    "AND shardid = get_shard_id_for_distribution_column('turns', 'acme')"
                )
            ).scalar_one()
        memory.close()
    worker = sa.make_url(url).set(port=port, drivername="postgresql")
    messages: list[str] = []
    with psycopg.connect(worker.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
        conn.execute("SET client_min_messages = debug2")
        conn.execute(
            "SELECT * FROM zerda_save_turn_v1('acme', 'Acme Corp and Berlin', 'ok', "
            "'[\"Acme Corp\", \"Berlin\"]'::json, 9.0, NULL, 'llm', 'ok', NULL, 1.0, 2, 1, "
            "9.0, ARRAY['acme corp', 'berlin'], ARRAY['acme', 'berlin'], "
            "ARRAY['Acme Corp', 'Berlin'], ARRAY['ORG', 'LOC'], ARRAY[0, 1], "
            "'Acme Corp and Berlin', 9.0, 9001, ARRAY[9002, 9003], ARRAY[9004, 9005], 9006, 5000)"
        ).fetchall()
        save, messages[:] = list(messages), []
        rows = conn.execute(
            "SELECT * FROM zerda_recall_v1('acme', ARRAY['acme corp', 'berlin'], 3)"
        ).fetchall()
        recall = list(messages)

    assert {row[3] for row in rows if row[5] is not None} >= {"Acme Corp and Berlin"}
    allowed = {"not pushing down function to the same node", ROUTER_PLAN}
    planned = [m for m in save if m not in allowed and "single distribution column" not in m]
    assert sum(m == ROUTER_PLAN for m in save) == 7  # three reads, four inserts
    assert planned == ["Deferred pruning " + FAST_PATH] * 3
    assert sum(m == ROUTER_PLAN for m in recall) == 4  # candidates, aliases, two entities'
    assert [m for m in recall if m not in allowed] == ["Deferred pruning " + FAST_PATH] * 4
