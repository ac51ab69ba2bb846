"""Statements compiled once per store and run on the driver's cursor.

The units of work run a handful of statements that never change shape. Going through
SQLAlchemy's execution layer costs 25–40 µs a statement on top of the driver's 5–10 µs (see
the README's performance section), so statements are compiled once per store and sent
straight to the pooled driver connection. They stay Core constructs built from :mod:`schema`;
the compiled text carries the dialect's quoting, casts and placeholders, values pass through
the column types' bind processors, and rows through their result processors, as SQLAlchemy's.

Statements go through the dialect's ``do_execute`` and ``do_commit``, as SQLAlchemy's own do,
so a hook there sees both; SQLAlchemy's cursor events (``before_cursor_execute`` and friends)
do not see these statements. Nothing here does I/O but :class:`Cursor`.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from sqlalchemy import Select, Table, bindparam, func, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql
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
    # The names and types of the columns it returns (none for a statement without rows).
    result_columns: tuple[tuple[str, Any], ...] = ()
    _template: list[Any] = field(init=False, repr=False, compare=False)
    _slots: list[tuple[int, str, Callable[[Any], Any] | None]] = field(
        init=False, repr=False, compare=False
    )
    _reader: RowReader | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        # Positional placeholders: the parameter list with the literals already in place,
        # and the slots that values fill, so a call does no dictionary work.
        process = dict(self.processors)
        template: list[Any] = []
        slots: list[tuple[int, str, Callable[[Any], Any] | None]] = []
        for index, name in enumerate(self.positions or ()):
            if name in self.literals:
                literal = self.literals[name]
                template.append(process[name](literal) if name in process else literal)
            else:
                template.append(None)
                slots.append((index, name, process.get(name)))
        object.__setattr__(self, "_template", template)
        object.__setattr__(self, "_slots", slots)

    @property
    def made_reader(self) -> RowReader | None:
        """:meth:`reader`, once made (the statement has returned rows before)."""
        return self._reader

    def reader(self, dialect: Dialect, description: Sequence[Any]) -> RowReader:
        """How to turn the driver's rows into named rows (made at the first execution,
        when the driver has said the columns' types)."""
        reader = self._reader
        if reader is None:
            reader = RowReader(self.result_columns, dialect, description)
            object.__setattr__(self, "_reader", reader)
        return reader

    def parameters(self, values: Mapping[str, Any]) -> Any:
        if self.positions is None:
            if self.literals or self.processors:
                values = {**self.literals, **values}
                for name, process in self.processors:
                    values[name] = process(values[name])
            return values
        parameters = self._template.copy()
        for index, name, convert in self._slots:
            value = values[name]
            parameters[index] = value if convert is None else convert(value)
        return parameters


def compile_statement(statement: ClauseElement, dialect: Dialect) -> CompiledStatement:
    """Compile ``statement`` once for ``dialect``. Every bound parameter must be a named
    ``bindparam`` with a type; expanding (``IN``) parameters are not supported: use one
    placeholder per value, or ``= ANY(:array)`` on Postgres."""
    compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
    sql = str(compiled)
    if "POSTCOMPILE" in sql:
        raise ValueError("expanding parameters cannot be compiled once: " + sql)
    if dialect.paramstyle == "pyformat":
        # psycopg's %b sends a parameter in binary: an array goes several times faster
        # than in text format, which escapes each element with a regular expression.
        for name, bind in compiled.binds.items():
            if isinstance(bind.type, postgresql.ARRAY):
                sql = sql.replace(f"%({name})s", f"%({name})b")
    processors = []
    for name, bind in compiled.binds.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors.append((name, process))
    positions = tuple(compiled.positiontup or ()) if compiled.positional else None
    literals = {name: bind.value for name, bind in compiled.binds.items() if not bind.required}
    result_columns = tuple((entry.keyname, entry.type) for entry in compiled._result_columns)
    return CompiledStatement(sql, positions, tuple(processors), literals, result_columns)


class RowReader:
    """Turns a statement's rows into named tuples (``row.name_key``, never ``row[2]``),
    with each column's result processor applied (JSON text on SQLite, for one)."""

    def __init__(
        self,
        columns: Sequence[tuple[str, Any]],
        dialect: Dialect,
        description: Sequence[Any],
    ) -> None:
        names = [name for name, _ in columns] or [column[0] for column in description]
        self.row_type: Any = namedtuple("Row", names, rename=True)  # type: ignore[misc]
        self._processors = []
        for index, ((_, type_), described) in enumerate(zip(columns, description, strict=False)):
            process = type_.dialect_impl(dialect)._cached_result_processor(dialect, described[1])
            if process is not None:
                self._processors.append((index, process))

    def __call__(self, rows: Sequence[Sequence[Any]]) -> list[Any]:
        make = self.row_type._make
        if not self._processors:
            return [make(row) for row in rows]
        converted = []
        for row in rows:
            values = list(row)
            for index, process in self._processors:
                values[index] = process(values[index])
            converted.append(make(values))
        return converted


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
    """A compiled statement: its SQL, its parameters from values, and its row reader."""

    @property
    def sql(self) -> str: ...

    def parameters(self, values: Any) -> Any: ...

    @property
    def made_reader(self) -> RowReader | None: ...

    def reader(self, dialect: Dialect, description: Sequence[Any]) -> RowReader: ...


def named_rows(dialect: Dialect, statement: Runnable, cursor: Any) -> list[Any]:
    """The rows ``statement`` returned on the driver's ``cursor``, named (none for a
    statement without rows)."""
    reader = statement.made_reader
    if reader is not None:  # it returned rows before: no description (psycopg makes one
        return reader(cursor.fetchall())  # anew each time it is asked)
    description = cursor.description
    if description is None:
        return []
    return statement.reader(dialect, description)(cursor.fetchall())


class Cursor:
    """Runs compiled statements on one driver cursor; the only runner there is."""

    __slots__ = ("_cursor", "_dialect")

    def __init__(self, dialect: Dialect, cursor: Any) -> None:
        self._dialect = dialect
        self._cursor = cursor

    def execute(self, statement: Runnable, values: Any) -> list[Any]:
        """Run ``statement`` with ``values`` (a mapping; rows for a multi-row insert); the
        named rows it returns (none for a statement without rows)."""
        cursor = self._cursor
        self._dialect.do_execute(cursor, statement.sql, statement.parameters(values), None)
        return named_rows(self._dialect, statement, cursor)

    def execute_count(self, statement: Runnable, values: Any) -> int:
        """Run a statement that returns no rows; how many rows it changed."""
        self._dialect.do_execute(self._cursor, statement.sql, statement.parameters(values), None)
        return int(self._cursor.rowcount)

    def execute_many(self, statement: Runnable, values: Sequence[Any]) -> int:
        """Run a statement that returns no rows once per values (the driver's executemany:
        one parameter set at a time, so no limit on how many); how many rows it changed."""
        parameters = [statement.parameters(one) for one in values]
        self._dialect.do_executemany(self._cursor, statement.sql, parameters, None)
        return int(self._cursor.rowcount)

    def execute_sql(self, sql: str) -> None:
        """Run a fixed statement with no parameters (transaction control)."""
        self._dialect.do_execute(self._cursor, sql, (), None)
