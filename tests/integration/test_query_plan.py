"""Recent snippets are read through a contexts index of the entity's snippets by recency
(led by session and entity, or by entity alone), newest first, and the read stops at the limit: no table scan and no sort, so its cost does not grow with the
table or with the entity's history.

The store holds 20,000 snippets (2,000 turns of 10 entities, one of them in every turn) and
its statistics are fresh (ANALYZE), as a production database's would be. The planner gets
no hints: with ``enable_seqscan`` left on, Postgres must choose the index by itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import ListedNames, driver_calls
from zerda_store import ConversationEntityMemory
from zerda_store.admin import AdminRepository

# The indexes that hold an entity's snippets in recency order (revision 0010 added the first).
INDEXES = ("ix_contexts_session_id_entity_id_turn_seq_id", "ix_contexts_entity_id_turn_seq_id")
HOT = "Hot Account"
OTHERS = [f"Contact {n:03d}" for n in range(199)]
TURNS = 2_000
NAMES_PER_TURN = 10


def _pairs() -> list[tuple[dict[str, str], dict[str, str]]]:
    pairs = []
    for turn in range(TURNS):
        others = [OTHERS[(turn * 9 + k) % len(OTHERS)] for k in range(NAMES_PER_TURN - 1)]
        pairs.append(({"input": ", ".join([HOT, *others]) + " | "}, {"output": f"turn {turn}"}))
    return pairs


@pytest.fixture
def busy_memory(database_url: str) -> Iterator[ConversationEntityMemory]:
    memory = ConversationEntityMemory(
        database_url=database_url, session_id="plans", extractor=ListedNames()
    )
    pairs = _pairs()
    for start in range(0, TURNS, 500):
        memory.save_contexts(pairs[start : start + 500])
    with memory.store.engine.begin() as connection:
        connection.exec_driver_sql("ANALYZE")
    yield memory
    memory.close()


@contextmanager
def reads_of_contexts(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """The reads (SELECT, or WITH ... SELECT) of the contexts table that run inside the block, with their
    parameters."""
    with driver_calls(engine) as sent:
        reads: list[tuple[str, Any]] = []
        yield reads
    reads += [
        (statement, parameters)
        for statement, parameters in sent
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and "contexts" in statement
    ]


def plan_of(engine: sa.Engine, statement: str, parameters: Any) -> str:
    if isinstance(parameters, list):  # positional; a list would read as many rows
        parameters = tuple(parameters)
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            rows = connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
            return "\n".join(str(row[-1]) for row in rows)
        rows = connection.exec_driver_sql("EXPLAIN " + statement, parameters)
        return "\n".join(str(row[0]) for row in rows)


def assert_reads_index_newest_first(engine: sa.Engine, statement: str, parameters: Any) -> None:
    plan = plan_of(engine, statement, parameters)
    if engine.dialect.name == "sqlite":
        used = (f"USING {kind}INDEX {index} " for kind in ("", "COVERING ") for index in INDEXES)
        assert any(using in plan for using in used), plan
        assert "USE TEMP B-TREE" not in plan, plan
        assert "SCAN contexts" not in plan, plan
    else:
        assert any(f"Index Scan Backward using {index} " in plan for index in INDEXES), plan
        assert "Sort" not in plan, plan
        assert "Seq Scan on contexts" not in plan, plan


def test_recent_contexts_read_the_entity_index_backwards_without_sorting(
    busy_memory: ConversationEntityMemory,
) -> None:
    entity = busy_memory.entity_store[HOT]
    engine = busy_memory.store.engine

    with reads_of_contexts(engine) as reads:
        recent = entity.get_recent_contexts()

    assert [text.rsplit(" ", 1)[-1] for text in recent] == [str(t) for t in range(TURNS - 3, TURNS)]
    assert len(reads) == 1, reads
    assert_reads_index_newest_first(engine, *reads[0])


def test_recall_reads_every_entity_through_the_index(
    busy_memory: ConversationEntityMemory,
) -> None:
    engine = busy_memory.store.engine

    with reads_of_contexts(engine) as reads:
        recalled = busy_memory.load_memory_variables({"input": f"{HOT}, {OTHERS[1]} | "})

    assert recalled["entity_info"].count("Previous information about") == 2
    assert reads
    for statement, parameters in reads:
        assert_reads_index_newest_first(engine, statement, parameters)


def test_recall_and_recent_contexts_under_a_policy_read_the_same_index(
    busy_memory: ConversationEntityMemory,
) -> None:
    """With a retention policy the reads carry each snippet's creation time and are
    filtered afterwards: the plan is the same index range, cut at the limit."""
    busy_memory.set_retention(keep_last=2, max_age=3600.0 * 24 * 365 * 100)
    engine = busy_memory.store.engine

    with reads_of_contexts(engine) as reads:
        recalled = busy_memory.load_memory_variables({"input": f"{HOT}, {OTHERS[1]} | "})
        recent = busy_memory.entity_store[HOT].get_recent_contexts()

    assert recalled["entity_info"].count("Previous information about") == 2
    assert [text.rsplit(" ", 1)[-1] for text in recent] == [str(t) for t in range(TURNS - 2, TURNS)]
    assert any("created_at" in statement for statement, _ in reads)
    for statement, parameters in reads:
        if "count(" in statement.lower():  # the visible-snippet check of entity_store[name]
            continue
        assert_reads_index_newest_first(engine, statement, parameters)


def test_an_export_right_after_a_bulk_write_is_planned_for_all_of_its_rows(
    postgres_url: str,
) -> None:
    """Before autovacuum has given the tables statistics (right after an import), the
    export's turns (joined to their ledger rows, read through a server-side cursor) are
    joined by hash or merge, never by a nested loop. Which nested loop the planner picks
    on tables without statistics depends on its estimates: here (3,000 turns) one index
    lookup per turn; at 70,000 turns one that joined each turn to every ledger row of
    the session, quadratic (over ten minutes). The export rules both out."""
    memory = ConversationEntityMemory(
        database_url=postgres_url, session_id="bulk", extractor=ListedNames()
    )
    engine = memory.store.engine
    with engine.begin() as connection:
        for table in ("turns", "entities", "contexts", "extractions"):
            connection.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    memory.save_contexts(
        ({"input": f"{HOT} | "}, {"output": f"turn {turn}"}) for turn in range(3_000)
    )

    with driver_calls(engine) as sent:
        records = list(AdminRepository(memory.store).export_session("bulk"))

    assert sum(record["kind"] == "turn" for record in records) == 3_000
    settings = [statement for statement, _ in sent if statement.upper().startswith("SET")]
    [(query, parameters)] = [
        (statement, parameters) for statement, parameters in sent if "JOIN extractions" in statement
    ]
    with engine.connect() as connection, connection.begin():
        for setting in settings:
            connection.exec_driver_sql(setting)
        rows = connection.exec_driver_sql("EXPLAIN DECLARE export CURSOR FOR " + query, parameters)
        plan = "\n".join(str(row[0]) for row in rows)
    memory.close()
    assert "Nested Loop" not in plan, plan  # the turns joined to the ledger by hash or merge
