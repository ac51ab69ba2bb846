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

import functools
import operator
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

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
    _reader: RowReader | None = field(init=False, repr=False, compare=False, default=None)
    # Positional placeholders: the values picked in placeholder order in one C call (the
    # literals, already converted, merged in first if any), then the few that a bind
    # processor converts, by index.
    _picked: Callable[[Mapping[str, Any]], Any] | None = field(
        init=False, repr=False, compare=False, default=None
    )
    _converted: tuple[tuple[int, Callable[[Any], Any]], ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        if self.positions is None:
            return
        process = dict(self.processors)
        fixed = {
            name: process[name](value) if name in process else value
            for name, value in self.literals.items()
        }
        converted = tuple(
            (index, process[name])
            for index, name in enumerate(self.positions)
            if name in process and name not in self.literals
        )
        object.__setattr__(self, "_picked", _picker(self.positions, fixed))
        object.__setattr__(self, "_converted", converted)

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
        if self._picked is None:  # named placeholders
            if self.literals or self.processors:
                values = {**self.literals, **values}
                for name, process in self.processors:
                    values[name] = process(values[name])
            return values
        picked = self._picked(values)
        if not self._converted:
            return picked
        parameters = list(picked)
        for index, convert in self._converted:
            parameters[index] = convert(parameters[index])
        return parameters


def _picker(
    positions: tuple[str, ...], literals: Mapping[str, Any]
) -> Callable[[Mapping[str, Any]], Any]:
    """Values in placeholder order, picked by one ``itemgetter`` (for one placeholder it
    gives the value alone: then a one-tuple)."""
    if not positions:
        return lambda values: ()
    get = operator.itemgetter(*positions)
    pick: Callable[[Mapping[str, Any]], Any] = (
        get if len(positions) > 1 else lambda values: (get(values),)
    )
    if not literals:
        return pick
    fixed = dict(literals)
    return lambda values: pick({**fixed, **values})


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
        self._new = functools.partial(tuple.__new__, self.row_type)
        self._processors = []
        for index, ((_, type_), described) in enumerate(zip(columns, description, strict=False)):
            process = type_.dialect_impl(dialect).result_processor(dialect, described[1])
            if process is not None:
                self._processors.append((index, process))

    def __call__(self, rows: Sequence[Sequence[Any]]) -> list[Any]:
        if not self._processors:  # each row made in C (what ``_make`` does, but its check)
            return list(map(self._new, rows))
        make = self.row_type._make
        converted = []
        for row in rows:
            values = list(row)
            for index, process in self._processors:
                values[index] = process(values[index])
            converted.append(make(values))
        return converted


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
    """Runs compiled statements on one driver cursor; the only runner there is. ``sent``
    counts the statements it ran (an executemany is one), for telemetry."""

    __slots__ = ("_cursor", "_dialect", "sent")

    def __init__(self, dialect: Dialect, cursor: Any) -> None:
        self._dialect = dialect
        self._cursor = cursor
        self.sent = 0

    def execute(self, statement: Runnable, values: Any) -> list[Any]:
        """Run ``statement`` with ``values`` (a mapping; rows for a multi-row insert); the
        named rows it returns (none for a statement without rows)."""
        cursor = self._cursor
        self.sent += 1
        self._dialect.do_execute(cursor, statement.sql, statement.parameters(values), None)
        return named_rows(self._dialect, statement, cursor)

    def execute_count(self, statement: Runnable, values: Any) -> int:
        """Run a statement that returns no rows; how many rows it changed."""
        self.sent += 1
        self._dialect.do_execute(self._cursor, statement.sql, statement.parameters(values), None)
        return int(self._cursor.rowcount)

    def execute_many(self, statement: Runnable, values: Sequence[Any]) -> int:
        """Run a statement that returns no rows once per values (the driver's executemany:
        one parameter set at a time, so no limit on how many); how many rows it changed."""
        parameters = [statement.parameters(one) for one in values]
        self.sent += 1
        self._dialect.do_executemany(self._cursor, statement.sql, parameters, None)
        return int(self._cursor.rowcount)

    def execute_sql(self, sql: str) -> None:
        """Run a fixed statement with no parameters (transaction control)."""
        self.sent += 1
        self._dialect.do_execute(self._cursor, sql, (), None)


# Where a psycopg connection's one cursor is kept: in its pool record's ``info``, which
# the pool clears when it replaces the driver connection.
_KEPT_CURSOR = "zerda_store.cursor"


def kept_cursor(connection: Any) -> Any:
    """The one cursor of a pooled psycopg connection, for every unit of work it runs, never
    closed. A new cursor copies the connection's map of adapters, and its first statement
    builds a transformer (the dumpers of the parameters' types, the loaders of the
    columns'); a kept one does the first never again, and the second only when a statement
    is not the one it ran last: about a seventh of a recall's or a save's instructions on
    the client (``docs/performance.md``). It holds the last statement's rows until the
    next one. (sqlite3's cursors cost little to make, and one left unfinished keeps a read
    open: a SQLite unit of work makes its own.)"""
    dbapi_connection = connection.dbapi_connection
    info = connection.info
    cursor = info.get(_KEPT_CURSOR)
    if cursor is None or cursor.closed or cursor.connection is not dbapi_connection:
        cursor = info[_KEPT_CURSOR] = dbapi_connection.cursor()
    return cursor
