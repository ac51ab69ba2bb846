"""The memory's statements, compiled for Postgres, against Citus's routing rule: each one
names its session (``session_id = ...`` for every distributed table it reads, or a
``session_id`` in the row it inserts), so that it runs on one shard. The ones that do not
yet would be listed exactly (no database needed)."""

from __future__ import annotations

import re

import pytest
from sqlalchemy.dialects import postgresql

from zerda_store.db.distribution import DISTRIBUTED_TABLES
from zerda_store.db.driver import CompiledStatement
from zerda_store.identity.statements import IdentityStatements
from zerda_store.turns.queries import Queries
from zerda_store.turns.resolving_recall import ResolvingRecall
from zerda_store.turns.single_trip import SingleTripSave
from zerda_store.turns.statements import RowsInsert, TurnStatements
from zerda_store.turns.visible import VisibleQueries

DIALECT = postgresql.psycopg.dialect()  # type: ignore[attr-defined]

# Reads and writes that do not name their session (none: each one routes to one shard).
UNROUTED: set[str] = set()

_TABLES = "|".join(DISTRIBUTED_TABLES)
_READ = re.compile(rf"\b(?:FROM|JOIN|UPDATE)\s+({_TABLES})\b(?:\s+AS\s+(\w+))?")
_INSERT = re.compile(rf"^INSERT INTO ({_TABLES}) \(([^)]*)\)")


def unrouted_tables(sql: str) -> list[str]:
    """The distributed tables a statement reads or changes without naming the session."""
    missing = []
    inserted = _INSERT.match(sql)
    if inserted and "session_id" not in inserted.group(2).split(", "):
        missing.append(inserted.group(1))
    for found in _READ.finditer(sql):
        name = found.group(2) or found.group(1)
        if not re.search(rf"\b{name}\.session_id = ", sql):
            missing.append(found.group(1))
    return missing


def compiled_statements() -> dict[str, str]:
    """Every fixed statement of the memory's path, by owner and attribute name."""
    found: dict[str, str] = {}
    for owner in (Queries(DIALECT), VisibleQueries(DIALECT)):
        for name, value in vars(owner).items():
            if isinstance(value, CompiledStatement):
                found[f"{type(owner).__name__}.{name}"] = value.sql
        for name, value in vars(getattr(owner, "turn_reads", object())).items():
            if isinstance(value, CompiledStatement):
                found[f"TurnReads.{name}"] = value.sql
    found["IdentityStatements.candidates"] = IdentityStatements(DIALECT).candidates.sql
    found["SingleTripSave.statement"] = SingleTripSave(DIALECT).statement.sql
    for aged in (False, True):
        found[f"ResolvingRecall{'.aged' if aged else ''}"] = (
            ResolvingRecall(DIALECT).statement(aged).sql
        )
    turn = TurnStatements(DIALECT)
    for aged in (False, True):
        [(recall, _)] = turn.recall_batches("s", ["k"], 3, aged=aged)
        found[f"TurnStatements.recall{'_aged' if aged else ''}"] = recall.sql
    return found


def test_the_statements_that_do_not_name_their_session_are_exactly_the_known_ones() -> None:
    statements = compiled_statements()
    assert statements.keys() >= UNROUTED
    assert {name for name, sql in statements.items() if unrouted_tables(sql)} == UNROUTED


def test_the_hot_path_names_its_session_in_every_statement() -> None:
    statements = compiled_statements()
    for name in (
        "TurnStatements.recall",
        "Queries.entity_by_key",
        "Queries.turn_by_key",
        "Queries.recent_contexts",
        "Queries.count_contexts",
        "Queries.add_context",
        "IdentityStatements.candidates",
        "SingleTripSave.statement",
        "ResolvingRecall",
        "ResolvingRecall.aged",
    ):
        assert unrouted_tables(statements[name]) == [], statements[name]


@pytest.mark.parametrize("kind", ["turn", "turns", "entities", "contexts", "outcomes"])
def test_every_insert_of_a_save_carries_the_session_in_its_rows(kind: str) -> None:
    insert = getattr(TurnStatements(DIALECT), kind)
    assert isinstance(insert, RowsInsert)
    assert "session_id" in insert.columns


def test_the_rule_check_sees_a_missing_session_filter() -> None:
    assert unrouted_tables("SELECT contexts.text FROM contexts WHERE contexts.entity_id = 1") == [
        "contexts"
    ]
    assert (
        unrouted_tables(
            "SELECT e.id FROM entities AS e JOIN contexts ON contexts.session_id = e.session_id "
            "WHERE e.session_id = %(s)s"
        )
        == []
    )
    assert unrouted_tables("INSERT INTO turns (input_text) VALUES (%(x)s)") == ["turns"]
