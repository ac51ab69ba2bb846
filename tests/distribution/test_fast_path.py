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
the worker that holds the session's shards, every statement reads or writes the shards
themselves, and Citus plans none of them. The tests fail when a hot statement is planned by
Citus there (docs/citus.md, Cost).

"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.citus import SAVE_CALL, Cluster
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


RECALL_CALL = "SELECT * FROM zerda_recall_v1('acme', ARRAY['acme corp', 'berlin'], 3)"


def _run_on(node: sa.URL, *statements: str, block: bool = False) -> list[tuple[list[str], Any]]:
    """Each statement run on ``node`` as Citus runs a delegated call there (in a transaction
    block: run there, not delegated further): Citus's planner messages for each, and its
    rows."""
    messages: list[str] = []
    taken: list[tuple[list[str], Any]] = []
    with psycopg.connect(node.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
        conn.execute("SET client_min_messages = debug2")
        for statement in statements:
            with conn.transaction() if block else nullcontext():
                cursor = conn.execute(statement)
                rows = cursor.fetchall() if cursor.description else []
            taken.append((list(messages), rows))
            messages.clear()
    return taken


def test_inside_the_functions_every_statement_is_on_the_sessions_shards(
    url: str, citus_cluster: Cluster
) -> None:
    """Each function run on the worker that holds the session's shards, as Citus runs a
    delegated call there, reads and writes the shards themselves: Citus plans none of its
    statements. On a worker that does not hold them (the shards moved after the
    coordinator sent the call), the save writes nothing and answers that the unit of work
    saves the turn, and the recall's one statement is routed whole to the shards."""
    with Store(url) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id="acme", store=store)
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
        with store.connect() as connection:
            holder, other = connection.execute(
                sa.text(
                    "SELECT n.nodeport FROM pg_dist_node n WHERE n.noderole = 'primary' "
                    "AND n.groupid > 0 ORDER BY n.groupid <> (SELECT p.groupid "
                    "FROM pg_dist_placement p WHERE p.shardid = "
                    "get_shard_id_for_distribution_column('turns', 'acme'))"
                )
            ).scalars()
        memory.close()
    here = sa.make_url(url).set(port=holder, drivername="postgresql")
    elsewhere = here.set(port=other)

    (save, saved), (recall, rows) = _run_on(here, SAVE_CALL.format(turn=9001), RECALL_CALL)
    assert saved == [(9001, False)]
    assert {row[3] for row in rows if row[5] is not None} >= {"Acme Corp and Berlin"}
    for messages in (save, recall):
        assert messages == ["not pushing down function to the same node"]

    (save, saved), (recall, rows) = _run_on(
        elsewhere, SAVE_CALL.format(turn=9101), RECALL_CALL, block=True
    )
    assert saved == [(None, True)]
    assert save == []
    assert sum(message == ROUTER_PLAN for message in recall) == 1
    snippets = [row[4] for row in rows if row[5] is not None and row[1] == "acme corp"]
    assert snippets[:2] == [9001, 1]  # the newest first: the save above, the first turn's


def _holder(url: str) -> tuple[sa.URL, int, int]:
    """After a first save of session "acme": the worker that holds its shards (a URL for
    the test's database there), and its shards of ``turns`` and ``entities``."""
    with Store(url) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id="acme", store=store)
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
        with store.connect() as connection:
            port, turns_shard, entities_shard = connection.execute(
                sa.text(
                    "SELECT n.nodeport, p.shardid, "
                    "get_shard_id_for_distribution_column('entities', 'acme') "
                    "FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) "
                    "WHERE p.shardid = get_shard_id_for_distribution_column('turns', 'acme')"
                )
            ).one()
        memory.close()
    return sa.make_url(url).set(port=port, drivername="postgresql"), turns_shard, entities_shard


def test_a_saves_and_a_recalls_statements_are_planned_once_per_connection(
    url: str, citus_cluster: Cluster
) -> None:
    """On the worker that holds the session's shards, the save's two statements and the
    recall's one are prepared on the connection once, for the session's shard group, and
    each later call runs them as prepared (PostgreSQL plans a statement that names a shard
    at every run otherwise): the plan cache counts every call's run of each, and a recall
    finds every save's turn."""
    here, turns_shard, entities_shard = _holder(url)
    turns = [9001 + 10 * n for n in range(8)]
    calls = [(SAVE_CALL.format(turn=turn), RECALL_CALL) for turn in turns]
    *runs, (_, prepared) = _run_on(
        here,
        *(call for pair in calls for call in pair),
        "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements "
        "WHERE name LIKE 'zerda\\_%' ORDER BY name",
    )
    saves, recalls = runs[0::2], runs[1::2]
    assert [rows for _, rows in saves] == [[(turn, False)] for turn in turns]
    for turn, (_, rows) in zip(turns, recalls, strict=True):
        newest = [row[4] for row in rows if row[5] is not None and row[1] == "acme corp"]
        assert newest[0] == turn
    # The guard's read and the writes, each named by the session's turns shard; the
    # recall, by its entities shard.
    shards = sorted(int(name.rsplit("_", 1)[1]) for name, _ in prepared)
    assert shards == sorted([turns_shard, turns_shard, entities_shard])
    assert [planned_runs for _, planned_runs in prepared] == [8, 8, 8]


def test_a_statement_prepared_in_a_call_rolled_back_is_run_by_the_next(
    url: str, citus_cluster: Cluster
) -> None:
    """The mark that a statement is prepared on the connection is a setting, undone with
    the transaction that made it; the prepared statement is not. A recall in a transaction
    rolled back, then another on the same connection: the second finds the statement (no
    "already exists"), and it is prepared once and run twice."""
    here, _, _ = _holder(url)
    with psycopg.connect(here.render_as_string(hide_password=False), autocommit=True) as conn:
        with conn.transaction(force_rollback=True):
            first = conn.execute(RECALL_CALL).fetchall()
        second = conn.execute(RECALL_CALL).fetchall()
        prepared = conn.execute(
            "SELECT generic_plans + custom_plans FROM pg_prepared_statements "
            "WHERE name LIKE 'zerda\\_%'"
        ).fetchall()
    assert first == second and any(row[5] is not None for row in first)
    assert prepared == [(2,)]


def test_statements_deallocated_under_the_functions_are_prepared_again(
    url: str, citus_cluster: Cluster
) -> None:
    """``DEALLOCATE ALL`` (which psycopg sends after a rollback once it has prepared
    statements of its own, where the functions run in a client's session) drops the
    functions' statements but not their marks: the next save on the connection finds them
    gone and prepares them again; the next recall reads through the distributed tables
    once, and the one after prepares its statement again."""
    here, _, _ = _holder(url)
    count = "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'zerda\\_%'"
    calls = (SAVE_CALL.format(turn=9001), RECALL_CALL, "DEALLOCATE ALL")
    again = (SAVE_CALL.format(turn=9011), RECALL_CALL, count, RECALL_CALL, count)
    *_, (_, saved), (_, recalled), (_, first), (_, recalled_again), (_, then) = _run_on(
        here, *calls, *again
    )
    assert saved == [(9011, False)]
    for rows in (recalled, recalled_again):
        newest = [row[4] for row in rows if row[5] is not None and row[1] == "acme corp"]
        assert newest[:1] == [9011]
    assert first == [(2,)] and then == [(3,)]


def test_a_save_keeps_every_digit_of_its_times_whatever_the_sessions_float_setting(
    url: str, citus_cluster: Cluster
) -> None:
    """The save's values reach its prepared statements as text: at ``extra_float_digits =
    0`` (a role's or a database's setting) a double would lose its last digits; the
    function sets it for itself."""
    here, _, _ = _holder(url)
    created_at = 1712345678.1234567
    call = SAVE_CALL.format(turn=9001).replace("::json, 9.0,", f"::json, {created_at!r},", 1)
    assert repr(created_at) in call
    (_, _), (_, saved) = _run_on(here, "SET extra_float_digits = 0", call)
    assert saved == [(9001, False)]
    with sa.create_engine(url).connect() as connection:
        stored = connection.execute(
            sa.text("SELECT created_at FROM turns WHERE session_id = 'acme' AND id = 9001")
        ).scalar_one()
    assert stored == created_at
