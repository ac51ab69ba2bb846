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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

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


class DriverCursor:
    """Runs compiled statements on one driver cursor inside a unit of work."""

    __slots__ = ("_cursor", "_dialect")

    def __init__(self, dialect: Dialect, cursor: Any) -> None:
        self._dialect = dialect
        self._cursor = cursor

    def execute(self, statement: CompiledStatement, values: Mapping[str, Any]) -> list[Any]:
        """Run ``statement``; the rows it returns (none for a statement without RETURNING)."""
        self._dialect.do_execute(self._cursor, statement.sql, statement.parameters(values), None)
        if self._cursor.description is None:
            return []
        return list(self._cursor.fetchall())

    def execute_sql(self, sql: str) -> None:
        """Run a fixed statement with no parameters (transaction control)."""
        self._dialect.do_execute(self._cursor, sql, (), None)
