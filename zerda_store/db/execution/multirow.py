"""Multi-row statements compiled once: a multi-row ``INSERT … VALUES`` whose placeholders
are named per row (:func:`row_placeholders`, :class:`RowsStatement`), and Postgres's
``INSERT … SELECT`` over one array per column (:func:`unnested_rows`,
:class:`ColumnsStatement`). Both take their values as row mappings and run like any
compiled statement (:class:`driver.Runnable`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Select, Table, bindparam, func, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

from .driver import CompiledStatement, RowReader, compile_statement


def row_placeholders(table: Table, columns: Sequence[str], count: int) -> list[dict[str, Any]]:
    """``count`` rows of typed placeholders for a multi-row INSERT's ``values()``, named
    ``r<row>_<column>``; compile the statement with :func:`compile_rows`."""
    return [
        {column: bindparam(_row_name(i, column), type_=table.c[column].type) for column in columns}
        for i in range(count)
    ]


def unnested_rows(table: Table, columns: Sequence[str], shared: Sequence[str] = ()) -> Select[Any]:
    """Postgres: the rows of one array parameter per column (named after the column),
    unnested in step and in array order, for ``INSERT … SELECT``; a ``shared`` column
    takes one value for every row. The statement's text is the same for any number of
    rows: parsed and planned once, sent as one round trip. Compile it with
    :func:`compile_columns`."""
    unshared = [column for column in columns if column not in shared]
    arrays = [
        bindparam(column, type_=postgresql.ARRAY(table.c[column].type, dimensions=1))
        for column in unshared
    ]
    rows = (
        func.unnest(*arrays)
        .table_valued(*unshared, with_ordinality="ordinality")
        .render_derived(name="unnested")
    )
    # A shared value is cast to its column's type: Citus plans the SELECT apart from the
    # INSERT and cannot tell an untyped parameter's type.
    selected = [
        sql_cast(bindparam(column, type_=table.c[column].type), table.c[column].type).label(column)
        if column in shared
        else rows.c[column]
        for column in columns
    ]
    return select(*selected).order_by(rows.c.ordinality)


class _MadeFrom:
    """A statement that runs a compiled one with parameters of its own making."""

    def __init__(self, compiled: CompiledStatement) -> None:
        self.sql = compiled.sql
        self._compiled = compiled
        self.reader = compiled.reader

    @property
    def made_reader(self) -> RowReader | None:
        return self._compiled.made_reader


class ColumnsStatement(_MadeFrom):
    """A statement made with :func:`unnested_rows`; its parameters come from row
    mappings, one list per column (one value for a shared column)."""

    def __init__(
        self,
        compiled: CompiledStatement,
        table: Table,
        columns: Sequence[str],
        shared: Sequence[str] = (),
    ):
        super().__init__(compiled)  # its arrays go in binary (:func:`compile_statement`)
        self._columns = tuple(column for column in columns if column not in shared)
        self._shared = tuple(shared)
        # psycopg refuses a list that mixes ints and floats: numbers take their column's type.
        self._numbers: dict[str, type] = {}
        for column in self._columns:
            python_type = table.c[column].type.python_type
            if python_type in (int, float):
                self._numbers[column] = python_type

    def parameters(self, rows: Sequence[Mapping[str, Any]]) -> Any:
        values: dict[str, Any] = {}
        for column in self._shared:
            value = values[column] = rows[0][column]
            if any(row[column] != value for row in rows):
                raise ValueError(f"rows differ in {column!r}, which they must share")
        for column in self._columns:
            column_values = [row[column] for row in rows]
            number = self._numbers.get(column)
            if number is not None:
                column_values = [v if v is None else number(v) for v in column_values]
            values[column] = column_values
        return self._compiled.parameters(values)


def compile_columns(
    statement: ClauseElement,
    dialect: Dialect,
    table: Table,
    columns: Sequence[str],
    shared: Sequence[str] = (),
) -> ColumnsStatement:
    """Compile once a statement whose rows come from :func:`unnested_rows`."""
    return ColumnsStatement(compile_statement(statement, dialect), table, columns, shared)


def _row_name(row: int, column: str) -> str:
    return f"r{row}_{column}"


class RowsStatement(_MadeFrom):
    """A multi-row statement made with :func:`row_placeholders`; its parameters come
    from row mappings. Where the placeholders are positional and in row order (SQLite),
    the rows are flattened straight into them, the hot path's cheapest form."""

    def __init__(self, compiled: CompiledStatement, columns: Sequence[str], count: int):
        super().__init__(compiled)
        self._columns = tuple(columns)
        # A row's values in column order, in one C call (the value alone for one column).
        self._row_values = operator.itemgetter(*self._columns)
        self._names = [{column: _row_name(i, column) for column in columns} for i in range(count)]
        in_row_order = tuple(name for names in self._names for name in names.values())
        positions = compiled.positions or ()
        rest = positions[len(in_row_order) :]
        self._flat = positions[: len(in_row_order)] == in_row_order and all(
            name in compiled.literals for name in rest
        )
        self._trailing = [compiled.literals[name] for name in rest] if self._flat else []
        processors = dict(compiled.processors)
        self._column_processors = [
            (offset, processors[_row_name(0, column)])
            for offset, column in enumerate(columns)
            if _row_name(0, column) in processors
        ]

    def parameters(self, rows: Sequence[Mapping[str, Any]]) -> Any:
        if not self._flat:
            return self._compiled.parameters(
                {
                    name: row[column]
                    for row, names in zip(rows, self._names, strict=True)
                    for column, name in names.items()
                }
            )
        width = len(self._columns)
        if width == 1:
            flat = list(map(self._row_values, rows))
        else:
            flat = list(itertools.chain.from_iterable(map(self._row_values, rows)))
        for offset, process in self._column_processors:
            flat[offset::width] = map(process, flat[offset::width])
        return flat + self._trailing if self._trailing else flat


def compile_rows(
    statement: ClauseElement, dialect: Dialect, columns: Sequence[str], count: int
) -> RowsStatement:
    """Compile once a statement whose values come from :func:`row_placeholders`."""
    return RowsStatement(compile_statement(statement, dialect), columns, count)
