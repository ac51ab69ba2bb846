"""What every wing's statements share: named parameters, the dialect's INSERT, and the base
of every statement class (:class:`Statements`), which compiles for its store's dialect and
keeps the shapes that are built once per count (of keys, of entity types).

A statement class is made once per store (:meth:`Store.statements`) and shared by every
memory on it, so that compiling never happens inside a transaction after the first use.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from ...errors import StoreError
from .driver import CompiledStatement, compile_statement

T = TypeVar("T")


def param(name: str, type_: Any = sa.BigInteger) -> Any:
    """A named, typed parameter (compiled statements take no anonymous ones). Whole numbers
    are 64-bit by default, as ids are: a 32-bit parameter would refuse an id past 2**31 on
    Postgres (its cast is ``::INTEGER``)."""
    return sa.bindparam(name, type_=type_)


class NameList(sa.types.UserDefinedType[Sequence[str]]):
    """A parameter that binds a list of names as the text ``json.dumps`` makes of it, the
    text a JSON column holds on SQLite, joined in C: the JSON type's own processor runs
    ``json.dumps`` and its encoder's Python, 132 of the 2,873 bytecodes of a SQLite save
    (``docs/performance.md``)."""

    cache_ok = True

    def get_col_spec(self, **_: Any) -> str:
        return "TEXT"

    def bind_processor(self, dialect: Dialect) -> Any:  # never given None: NOT NULL
        return names_json


def names_json(names: Sequence[str]) -> str:
    """``json.dumps(names)`` for a list of str, quoted by the same C function."""
    return "[" + ", ".join(map(_QUOTED, names)) + "]"


_QUOTED = json.encoder.encode_basestring_ascii


def session_param() -> Any:
    """The ``session_id`` parameter every per-session statement takes."""
    return param("session_id", sa.String)


def binds_arrays(dialect: Dialect) -> bool:
    """Whether a list binds as one array parameter (Postgres: ``= ANY(:keys)``, ``unnest``),
    so that one statement takes any number of keys or rows whole; SQLite's statements take a
    JSON array (``json_each``) or one placeholder per value instead."""
    return dialect.name == "postgresql"


def custom_plans(dialect: Dialect) -> CompiledStatement | None:
    """The statement that has the rest of its transaction planned for each statement's own
    values (Postgres's ``plan_cache_mode``; a plan made once per connection may have been
    made while the tables were nearly empty); None where every statement is planned anew
    (SQLite)."""
    if dialect.name != "postgresql":
        return None
    setting = sa.select(sa.func.set_config("plan_cache_mode", "force_custom_plan", True))
    return compile_statement(setting, dialect)


def whole_table_joins(dialect: Dialect) -> str | None:
    """The SQL that has the rest of its transaction join whole sessions by hash or merge,
    never row by row (Postgres's planner, before the tables have statistics, takes a session
    for a few rows); None where there is no such choice (SQLite)."""
    return "SET LOCAL enable_nestloop = off" if dialect.name == "postgresql" else None


def dialect_insert(dialect: str) -> Any:
    """The dialect's INSERT construct (with ``on_conflict_do_...`` and ``returning``)."""
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise StoreError(f"unsupported database {dialect!r}: zerda_store runs on SQLite and Postgres")


class Statements:
    """The base of every statement class: statements compiled for one dialect, and those
    built once per count (:meth:`per_count`) the first time a count is met."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._per_count: dict[Hashable, Any] = {}

    def compiled(self, statement: Any) -> CompiledStatement:
        """``statement`` compiled for this dialect."""
        return compile_statement(statement, self.dialect)

    def per_count(self, count: Hashable, build: Callable[[], T]) -> T:
        """What ``build`` makes for ``count``, made once (two threads meeting a new count
        at once may both build it; either result serves)."""
        made = self._per_count.get(count)
        if made is None:
            made = self._per_count[count] = build()
        return made
