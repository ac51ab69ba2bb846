"""Compiled statements: the parameters they build must be the ones their SQL expects."""

from __future__ import annotations

import json
import random

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import psycopg

from zerda_store.db.execution.driver import compile_statement
from zerda_store.db.execution.multirow import (
    RowsStatement,
    compile_columns,
    compile_rows,
    row_placeholders,
    unnested_rows,
)
from zerda_store.db.execution.statements import NameList
from zerda_store.db.schema import contexts, entities, extractions, insert_columns, turns
from zerda_store.turns.statements import statement_sizes

TABLES = {"turns": turns, "entities": entities, "contexts": contexts, "outcomes": extractions}
ROW_COLUMNS = {kind: insert_columns(table) for kind, table in TABLES.items()}


def _row(kind: str, rng: random.Random) -> dict[str, object]:
    values: dict[str, object] = {}
    for column in ROW_COLUMNS[kind]:
        type_ = TABLES[kind].c[column].type
        if isinstance(type_, sa.Float):
            values[column] = rng.random() * 1e9
        elif isinstance(type_, sa.JSON):
            values[column] = [f"name {rng.randint(0, 9)}"]
        elif isinstance(type_, sa.Integer):
            values[column] = rng.randint(1, 10**6)
        else:
            values[column] = f"{column} {rng.randint(0, 10**6)}"
    return values


@pytest.mark.parametrize("kind", ["turns", "entities", "contexts", "outcomes"])
@pytest.mark.parametrize("count", [1, 3, 8, 17])
def test_flat_row_parameters_match_the_named_ones(kind: str, count: int) -> None:
    table = TABLES[kind]
    statement = sqlite.insert(table).values(row_placeholders(table, ROW_COLUMNS[kind], count))
    if kind == "entities":  # a literal after the rows' placeholders
        statement = statement.on_conflict_do_update(
            index_elements=["session_id", "name_key"],
            set_={"entity_type": sa.case((table.c.entity_type == "unknown", "x"), else_="y")},
        )
    compiled = compile_rows(statement, sqlite.dialect(), ROW_COLUMNS[kind], count)
    rows = [_row(kind, random.Random(n)) for n in range(count)]
    slow = RowsStatement.__new__(RowsStatement)
    slow.__dict__.update(compiled.__dict__)
    slow._flat = False

    assert compiled._flat
    assert compiled.parameters(rows) == list(slow.parameters(rows))
    assert compiled.sql.count("?") == len(compiled.parameters(rows))


def test_json_values_are_encoded_in_their_column_only() -> None:
    columns = ROW_COLUMNS["turns"]
    statement = sqlite.insert(turns).values(row_placeholders(turns, columns, 2))
    compiled = compile_rows(statement, sqlite.dialect(), columns, 2)
    rows = [_row("turns", random.Random(n)) for n in range(2)]

    parameters = compiled.parameters(rows)

    width = len(columns)
    names_at = columns.index("entity_names")
    assert [json.loads(parameters[names_at + i * width]) for i in range(2)] == [
        row["entity_names"] for row in rows
    ]
    assert parameters[columns.index("input_text")] == rows[0]["input_text"]


def test_a_name_list_binds_the_text_the_json_type_would() -> None:
    rng = random.Random(7)
    letters = ["a", "Z", " ", '"', "\\", "\n", "\x01", "é", "ش", "🙂", "\u2028", "/", "،"]
    as_json = turns.c.entity_names.type.dialect_impl(sqlite.dialect()).bind_processor(
        sqlite.dialect()
    )
    name_list = NameList().bind_processor(sqlite.dialect())
    for _ in range(2000):
        names = [
            "".join(rng.choices(letters, k=rng.randint(0, 6))) for _ in range(rng.randint(0, 4))
        ]
        assert name_list(names) == as_json(names) == json.dumps(names)


def test_literals_fill_their_places_in_positional_parameters() -> None:
    statement = (
        sa.select(contexts.c.text)
        .where(contexts.c.entity_id == sa.bindparam("entity_id"), contexts.c.text != "skip me")
        .limit(sa.bindparam("limit"))
    )
    compiled = compile_statement(statement, sqlite.dialect())

    assert list(compiled.parameters({"entity_id": 7, "limit": 3})) == [7, "skip me", 3, 0]


def test_positional_parameters_convert_only_their_processed_values() -> None:
    names = sa.bindparam("names", type_=turns.c.entity_names.type)
    at = sa.bindparam("at", type_=turns.c.created_at.type)
    session = sa.bindparam("session_id", type_=sa.String)
    statement = sqlite.insert(turns).values(
        session_id=session, input_text="fixed", output_text=session, entity_names=names,
        created_at=at,
    )  # fmt: skip
    compiled = compile_statement(statement, sqlite.dialect())
    values = {"session_id": "s-1", "names": ["Sarah Chen"], "at": 5}

    parameters = list(compiled.parameters(values))

    assert parameters == ["s-1", "fixed", "s-1", '["Sarah Chen"]', 5.0]
    assert isinstance(parameters[4], float)
    assert compile_statement(sa.text("SELECT 1"), sqlite.dialect()).parameters({}) == ()


def test_expanding_parameters_are_refused() -> None:
    statement = sa.select(turns.c.id).where(turns.c.id.in_(sa.bindparam("ids", expanding=True)))
    with pytest.raises(ValueError, match="expanding"):
        compile_statement(statement, sqlite.dialect())


def test_postgres_arrays_go_in_binary_one_list_per_column() -> None:
    columns = ROW_COLUMNS["contexts"]
    statement = postgresql.insert(contexts).from_select(
        list(columns), unnested_rows(contexts, columns)
    )
    compiled = compile_columns(statement, psycopg.dialect(), contexts, columns)
    rows = [_row("contexts", random.Random(n)) for n in range(3)]

    assert all(f"%({column})b" in compiled.sql for column in columns)
    assert "s::" not in compiled.sql.replace("%(", "")  # no text-format placeholder left
    parameters = compiled.parameters(rows)
    assert {column: list(parameters[column]) for column in columns} == {
        column: [row[column] for row in rows] for column in columns
    }


def test_postgres_number_arrays_take_their_column_type() -> None:
    """psycopg refuses a list that mixes ints and floats (an imported file may)."""
    columns = ROW_COLUMNS["turns"]
    statement = postgresql.insert(turns).from_select(list(columns), unnested_rows(turns, columns))
    compiled = compile_columns(statement, psycopg.dialect(), turns, columns)
    rows = [_row("turns", random.Random(n)) for n in range(3)]
    rows[0]["created_at"], rows[1]["created_at"] = 1700000000, None

    created = compiled.parameters(rows)["created_at"]

    assert created[:2] == [1700000000.0, None]
    assert [type(value) for value in created] == [float, type(None), float]


def test_statement_sizes_cover_every_row_with_few_distinct_sizes() -> None:
    seen: set[int] = set()
    for count in range(300):
        sizes = statement_sizes(count)
        seen.update(sizes)

        assert sum(sizes) == count
        assert all(0 < size <= 64 for size in sizes)
        assert len(sizes) <= count // 64 + 2
    assert seen == {*range(1, 9), *range(16, 65, 8)}


def test_a_shared_column_goes_once_and_must_be_the_same_in_every_row() -> None:
    columns = ROW_COLUMNS["contexts"]
    statement = postgresql.insert(contexts).from_select(
        list(columns), unnested_rows(contexts, columns, ("session_id",))
    )
    compiled = compile_columns(statement, psycopg.dialect(), contexts, columns, ("session_id",))
    rows = [{**_row("contexts", random.Random(n)), "session_id": "crm-1"} for n in range(3)]

    assert "%(session_id)s" in compiled.sql and "%(session_id)b" not in compiled.sql
    assert compiled.parameters(rows)["session_id"] == "crm-1"
    rows[2]["session_id"] = "crm-2"
    with pytest.raises(ValueError, match="session_id"):
        compiled.parameters(rows)
