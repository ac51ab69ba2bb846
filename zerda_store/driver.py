"""Hot-path statements: SQLAlchemy Core statements compiled once, run on the driver's cursor.

A chat turn's save and recall run a handful of statements that never change shape. Going
through SQLAlchemy's execution layer costs 25–40 µs a statement on top of the driver's
5–10 µs (see the README's performance section), so those statements are compiled once per
store and sent straight to the pooled driver connection. The statements stay Core
constructs built from :mod:`zerda_store.schema`; the compiled text carries the dialect's
quoting, casts and placeholders, and values pass through the column types' bind processors
exactly as SQLAlchemy would pass them.

Statements go through the dialect's ``do_execute`` and ``do_commit``, as SQLAlchemy's own do,
so a hook there sees both paths; SQLAlchemy's cursor events (``before_cursor_execute`` and
friends) do not see these statements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Table, bindparam
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler


@dataclass(frozen=True)
class CompiledStatement:
    """One statement's SQL text for one dialect, and how to turn values into parameters."""

    sql: str
    # The parameter names in placeholder order (qmark dialects), or None (named placeholders).
    positions: tuple[str, ...] | None
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]
    # The values of the literals in the statement (SQLAlchemy binds them as parameters).
    literals: Mapping[str, Any]

    def parameters(self, values: Mapping[str, Any]) -> Any:
        if self.literals or self.processors:
            values = {**self.literals, **values}
            for name, process in self.processors:
                values[name] = process(values[name])
        if self.positions is None:
            return values
        return tuple([values[name] for name in self.positions])


def compile_statement(statement: ClauseElement, dialect: Dialect) -> CompiledStatement:
    """Compile ``statement`` once for ``dialect``. Every bound parameter must be a named
    ``bindparam`` with a type; expanding (``IN``) parameters are not supported: use one
    placeholder per value, or ``= ANY(:array)`` on Postgres."""
    compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
    sql = str(compiled)
    if "POSTCOMPILE" in sql:
        raise ValueError("expanding parameters cannot be compiled once: " + sql)
    processors = []
    for name, bind in compiled.binds.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors.append((name, process))
    positions = tuple(compiled.positiontup or ()) if compiled.positional else None
    literals = {name: bind.value for name, bind in compiled.binds.items() if not bind.required}
    return CompiledStatement(sql, positions, tuple(processors), literals)


def row_placeholders(table: Table, columns: Sequence[str], count: int) -> list[dict[str, Any]]:
    """``count`` rows of typed placeholders for a multi-row INSERT's ``values()``, named
    ``r<row>_<column>``; compile the statement with :func:`compile_rows`."""
    return [
        {column: bindparam(_row_name(i, column), type_=table.c[column].type) for column in columns}
        for i in range(count)
    ]


def _row_name(row: int, column: str) -> str:
    return f"r{row}_{column}"


class RowsStatement:
    """A multi-row statement made with :func:`row_placeholders`; its parameters come
    from row mappings. Where the placeholders are positional and in row order (SQLite),
    the rows are flattened straight into them, the hot path's cheapest form."""

    def __init__(self, compiled: CompiledStatement, columns: Sequence[str], count: int):
        self.sql = compiled.sql
        self._compiled = compiled
        self._columns = tuple(columns)
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
        columns = self._columns
        flat = [row[column] for row in rows for column in columns]
        for offset, process in self._column_processors:
            flat[offset :: len(columns)] = [process(v) for v in flat[offset :: len(columns)]]
        return flat + self._trailing if self._trailing else flat


def compile_rows(
    statement: ClauseElement, dialect: Dialect, columns: Sequence[str], count: int
) -> RowsStatement:
    """Compile once a statement whose values come from :func:`row_placeholders`."""
    return RowsStatement(compile_statement(statement, dialect), columns, count)


class Runnable(Protocol):
    sql: str

    def parameters(self, values: Any) -> Any: ...


class DriverCursor:
    """Runs compiled statements on one driver cursor inside a unit of work."""

    __slots__ = ("_cursor", "_dialect")

    def __init__(self, dialect: Dialect, cursor: Any) -> None:
        self._dialect = dialect
        self._cursor = cursor

    def execute(self, statement: Runnable, values: Any) -> list[Any]:
        """Run ``statement`` with ``values`` (a mapping; rows for a :class:`RowsStatement`);
        the rows it returns (none for a statement without RETURNING)."""
        self._dialect.do_execute(self._cursor, statement.sql, statement.parameters(values), None)
        if self._cursor.description is None:
            return []
        return list(self._cursor.fetchall())

    def execute_sql(self, sql: str) -> None:
        """Run a fixed statement with no parameters (transaction control)."""
        self._dialect.do_execute(self._cursor, sql, (), None)
