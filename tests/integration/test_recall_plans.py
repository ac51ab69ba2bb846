"""The hot statements are planned the same before Postgres has statistics as after: each
mentioned entity's newest snippets read backwards on an index of the entity's snippets by
recency, cut at the limit (no bitmap of the session's snippets, no sort).

A freshly filled database is the case to fear: until autovacuum (or an ``ANALYZE``) runs,
the planner guesses that a session holds a two-hundredth of the table, so reading every
snippet of the session looked cheaper than it was (revision 0010 fixed it: before it, the
recall of a 60,000-snippet session AND-ed a bitmap of the session's 60,000 snippets with
one of the entity's, then sorted them). On a small table (the entities, the aliases) it
takes a session for about one row, so any index led by the session looked as cheap for a
lookup of one key as the key's own, and the entities were found by reading the session on
another index and filtering it (revision 0014 leaves each lookup one index that can serve
it). Here autovacuum is off on the test's database, so the statistics are missing for
sure; the statements are explained as the store sends them, with their parameters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from psycopg.types.json import Json

from tests.doubles import ListedNames, driver_calls
from zerda_store import ConversationEntityMemory
from zerda_store.db import statistics
from zerda_store.db.schema import metadata
from zerda_store.db.store import core_of
from zerda_store.turns.statements import TurnStatements

pytestmark = pytest.mark.postgres

SESSION = "big"
NAMES = [f"Contact {n:03d}" for n in range(400)]
TURNS = 20_000
NEWEST_BY_RECENCY = {
    "ix_contexts_session_id_entity_id_turn_seq_id",
    "ix_contexts_entity_id_turn_seq_id",
}
# The index of each lookup of the resolving recall: (table, the column looked up by).
LOOKUP_INDEXES = {
    ("entities", "name_key"): "uq_entities_session_id_name_key",
    ("entities", "core_key"): "ix_entities_core_key_session_id",
    ("entities", "id"): "pk_entities",
    ("entity_aliases", "alias_key"): "uq_entity_aliases_session_id_alias_key",
    ("entity_aliases", "core_key"): "ix_entity_aliases_core_key_session_id",
}
ALL_LOOKUPS = frozenset(LOOKUP_INDEXES.values())
# Another name of each entity: the recall looks its keys up among them too.
ALIASES = {name: f"Account {n:03d}" for n, name in enumerate(NAMES)}


def _pair(turn: int) -> tuple[dict[str, str], dict[str, str]]:
    names = [NAMES[(turn * 7 + k * 131) % len(NAMES)] for k in range(3)]
    return {"input": ", ".join(names) + " | "}, {"output": f"turn {turn}"}


@pytest.fixture
def unanalysed(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ConversationEntityMemory]:
    """A session of 20,000 turns (60,000 snippets, 400 entities) in a database whose
    tables Postgres has never analysed: saved in one batch, which is not a bulk one here."""
    monkeypatch.setattr(statistics, "BULK_ROWS", TURNS + 1)
    memory = ConversationEntityMemory(
        database_url=postgres_url, session_id=SESSION, extractor=ListedNames()
    )
    with memory.store.engine.begin() as connection:
        for table in metadata.sorted_tables:
            connection.exec_driver_sql(f"ALTER TABLE {table.name} SET (autovacuum_enabled = false)")
    memory.save_contexts(_pair(turn) for turn in range(TURNS))
    for name, alias in ALIASES.items():
        memory.add_alias(name, alias)
    assert _analysed(memory.store.engine) == {}
    yield memory
    memory.close()


def _analysed(engine: sa.Engine) -> dict[str, Any]:
    """The memory's tables that were ever analysed, with when."""
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT relname, coalesce(last_analyze, last_autoanalyze) AS analysed"
            " FROM pg_stat_user_tables WHERE coalesce(last_analyze, last_autoanalyze) IS NOT NULL"
        )
        tables = {table.name for table in metadata.sorted_tables}
        return {row.relname: row.analysed for row in rows if row.relname in tables}


def _hot_reads(memory: ConversationEntityMemory) -> list[tuple[str, Any]]:
    """The reads of the snippets that the hot calls send, with their parameters: the
    recall (resolving, as a memory sends it, and plain, as a memory that keeps names
    exact does), an entity's details, and the idempotency check of a save."""
    mentioned = NAMES[1:4]
    store = memory.store
    plain = (
        core_of(store)
        .statements(TurnStatements)
        .recall_batches(SESSION, [name.casefold() for name in mentioned], 3)
    )
    with driver_calls(store.engine) as sent:
        recalled = memory.load_memory_variables({"input": ", ".join(mentioned) + " | "})
        assert recalled["entity_info"].count("Previous information about") == 3
        assert core_of(store).read(lambda transaction: transaction.run(*plain[0]))
        assert memory.get_entity_info(NAMES[5])
        memory.save_context({"input": "Contact 007 | "}, {"output": "again"}, idempotency_key="k")
    return [
        (statement, parameters)
        for statement, parameters in sent
        if statement.lstrip().upper().startswith(("SELECT", "WITH"))
        and ("contexts" in statement or "idempotency_key" in statement)
        and "count(" not in statement.lower()  # the details' count of the entity's snippets
    ]


def _plan(engine: sa.Engine, statement: str, parameters: Any) -> dict[str, Any]:
    if isinstance(parameters, list):  # positional; a list would read as many rows
        parameters = tuple(parameters)
    with engine.connect() as connection:
        explained = connection.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)
        return dict(explained.scalar_one()[0]["Plan"])


def _nodes(plan: dict[str, Any], above: tuple[str, ...] = ()) -> Iterator[tuple[dict, tuple]]:
    """Every node of ``plan``, with the node types above it (nearest last)."""
    yield plan, above
    for child in plan.get("Plans", []):
        yield from _nodes(child, (*above, plan["Node Type"]))


def _snippet_reads(plan: dict[str, Any]) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
    """The nodes of ``plan`` that read the snippets (not those that write them)."""
    return [
        (node, above)
        for node, above in _nodes(plan)
        if node.get("Relation Name") == "contexts" and node["Node Type"] != "ModifyTable"
    ]


def assert_snippets_read_newest_first_by_entity(plan: dict[str, Any]) -> None:
    for node, above in _snippet_reads(plan):
        described = f"{node['Node Type']} {node.get('Index Name')}: {plan}"
        assert node["Node Type"] == "Index Scan", described
        assert node["Index Name"] in NEWEST_BY_RECENCY, described
        assert node["Scan Direction"] == "Backward", described
        assert "entity_id" in node["Index Cond"], described
        # The limit cuts the scan: only a Result (a one-time filter) between them.
        nearest = [kind for kind in above if kind != "Result"]
        assert nearest and nearest[-1] == "Limit", described
    kinds = {node["Node Type"] for node, _ in _nodes(plan)}
    assert not kinds & {"Sort", "Incremental Sort", "BitmapAnd"}, plan


def assert_turn_found_by_its_key(plan: dict[str, Any]) -> None:
    [read] = [node for node, _ in _nodes(plan) if node.get("Relation Name") == "turns"]
    assert read["Node Type"] in ("Index Scan", "Index Only Scan"), plan
    assert read["Index Name"] == "uq_turns_session_id_idempotency_key", plan


def assert_planned_by_index(engine: sa.Engine, reads: list[tuple[str, Any]]) -> None:
    snippets = checks = 0
    for statement, parameters in reads:
        plan = _plan(engine, statement, parameters)
        if _snippet_reads(plan):
            assert_snippets_read_newest_first_by_entity(plan)
            snippets += 1
        elif statement.lstrip().upper().startswith("SELECT"):
            assert_turn_found_by_its_key(plan)
            checks += 1
    assert snippets >= 3 and checks, reads  # two recalls and an entity's details; a check


def test_hot_reads_use_the_entity_index_before_the_tables_are_analysed(
    unanalysed: ConversationEntityMemory,
) -> None:
    engine = unanalysed.store.engine
    reads = _hot_reads(unanalysed)
    assert _analysed(engine) == {}

    assert_planned_by_index(engine, reads)


def test_hot_reads_use_the_entity_index_once_the_tables_are_analysed(
    unanalysed: ConversationEntityMemory,
) -> None:
    engine = unanalysed.store.engine
    with engine.connect() as connection:
        connection.exec_driver_sql("ANALYZE")
        connection.commit()
    reads = _hot_reads(unanalysed)

    assert_planned_by_index(engine, reads)


def _literal(value: Any) -> str:
    """``value`` written in SQL (EXPLAIN EXECUTE takes no bound parameters)."""
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(map(_literal, value)) + "]::varchar[]"
    if value is None:
        return "NULL"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Json):
        value = json.dumps(value.obj)
    return "'" + str(value).replace("'", "''") + "'"


# The type each kind of parameter is declared with (a NULL's: any the column takes).
_TYPES = {
    list: "varchar[]",
    str: "varchar",
    int: "bigint",
    float: "double precision",
    type(None): "varchar",
    Json: "json",
}


def _generic_plan(engine: sa.Engine, statement: str, parameters: dict[str, Any]) -> dict:
    """The plan Postgres keeps for ``statement`` once prepared on a store's connection
    (``plan_cache_mode = force_generic_plan``): made without the parameters' values."""
    order: list[str] = []

    def numbered(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)[sb]", numbered, statement)
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SHOW plan_cache_mode").scalar() == "force_generic_plan"
        declared = ", ".join(_TYPES[type(parameters[name])] for name in order)
        connection.exec_driver_sql(f"PREPARE hot({declared}) AS {prepared}")
        try:
            values = ", ".join(_literal(parameters[name]) for name in order)
            explained = connection.exec_driver_sql(f"EXPLAIN (FORMAT JSON) EXECUTE hot({values})")
            return dict(explained.scalar_one()[0]["Plan"])
        finally:
            connection.exec_driver_sql("DEALLOCATE hot")


def _lookup(node: dict[str, Any]) -> tuple[str, str]:
    """(table, the column a lookup node finds its rows by): the one its condition compares
    with a value of the statement's (the session is compared with its parameter)."""
    condition = node.get("Index Cond", "")
    columns = {
        column for table, column in LOOKUP_INDEXES if table == node["Relation Name"]
    }  # fmt: skip
    found = [c for c in columns if re.search(rf"\b{c} = ", condition)]
    assert len(found) == 1, node
    return node["Relation Name"], found[0]


def assert_each_lookup_on_its_own_index(
    plan: dict[str, Any], expected: frozenset[str] = ALL_LOOKUPS
) -> None:
    """Every read of the entities and the aliases finds its rows on the index of its key
    and the session, both in the index condition: not the session read on another index
    and filtered by the key. ``expected``: the indexes the plan reads."""
    used = set()
    for node, _ in _nodes(plan):
        if node.get("Relation Name") not in ("entities", "entity_aliases"):
            continue
        if node["Node Type"] == "ModifyTable":
            continue
        described = f"{node['Node Type']} {node.get('Index Name')}: {node}"
        assert node["Node Type"] in ("Index Scan", "Index Only Scan"), described
        assert "session_id" in node["Index Cond"], described
        assert "session_id" not in node.get("Filter", ""), described
        assert node["Index Name"] == LOOKUP_INDEXES[_lookup(node)], described
        used.add(node["Index Name"])
    assert used == expected, plan


@pytest.fixture(params=[False, True], ids=["never-analysed", "analysed"])
def planned(
    unanalysed: ConversationEntityMemory, request: pytest.FixtureRequest
) -> ConversationEntityMemory:
    """The big session's memory, its tables never analysed, then analysed."""
    if request.param:
        with unanalysed.store.engine.connect() as connection:
            connection.exec_driver_sql("ANALYZE")
            connection.commit()
    return unanalysed


def test_the_recall_keeps_a_generic_plan_on_each_lookups_own_index(
    planned: ConversationEntityMemory,
) -> None:
    engine = planned.store.engine
    statement, parameters = next(
        read for read in _hot_reads(planned) if "WITH candidates" in read[0]
    )
    plan = _generic_plan(engine, statement, parameters)
    assert_snippets_read_newest_first_by_entity(plan)
    assert_each_lookup_on_its_own_index(plan)


def _sent(memory: ConversationEntityMemory, call: Any, marker: str) -> tuple[str, Any]:
    """The one statement holding ``marker`` that ``call`` sends, with its parameters."""
    with driver_calls(memory.store.engine) as sent:
        call()
    [read] = [(statement, parameters) for statement, parameters in sent if marker in statement]
    return read


def test_an_entitys_details_and_a_listing_keep_their_own_indexes(
    planned: ConversationEntityMemory,
) -> None:
    engine = planned.store.engine
    details = lambda: planned.get_entity_info(ALIASES[NAMES[9]])  # noqa: E731
    candidates = _sent(planned, details, "OFFSET 0")  # the name resolved, a probe per key
    by_name = _sent(planned, details, "name_key = %(key)s")
    listing = _sent(planned, planned.list_entities, "ORDER BY entities.first_turn_id")

    assert_each_lookup_on_its_own_index(_generic_plan(engine, *candidates))
    [found] = [n for n, _ in _nodes(_generic_plan(engine, *by_name)) if "Relation Name" in n]
    assert found["Index Name"] == "uq_entities_session_id_name_key", found
    assert "Filter" not in found, found
    [listed] = [n for n, _ in _nodes(_generic_plan(engine, *listing)) if "Relation Name" in n]
    assert listed["Node Type"] == "Index Scan", listed
    assert listed["Index Name"] == "ix_entities_first_seen", listed


def test_a_saves_guard_looks_each_name_up_on_its_own_index(
    planned: ConversationEntityMemory,
) -> None:
    """The single-trip save's guard (whether resolution is needed): the mention's key, its
    alias, and its core among the entities and the aliases."""
    save = lambda: planned.save_context({"input": "Dr. Contact 012 | "}, {"output": "again"})  # noqa: E731
    one_trip = _sent(planned, save, "guard AS")

    plan = _generic_plan(planned.store.engine, *one_trip)
    assert_each_lookup_on_its_own_index(plan, ALL_LOOKUPS - {"pk_entities"})
