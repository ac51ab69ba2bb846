"""What every wing's statements share: named parameters, the dialect's INSERT, and the base
of every statement class (:class:`Statements`), which compiles for its store's dialect and
keeps the shapes that are built once per count (of keys, of entity types).

A statement class is made once per store (:meth:`Store.statements`) and shared by every
memory on it, so that compiling never happens inside a transaction after the first use.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from ..errors import StoreError
from .driver import CompiledStatement, compile_statement

T = TypeVar("T")


def param(name: str, type_: Any = sa.BigInteger) -> Any:
    """A named, typed parameter (compiled statements take no anonymous ones). Whole numbers
    are 64-bit by default, as ids are: a 32-bit parameter would refuse an id past 2**31 on
    Postgres (its cast is ``::INTEGER``)."""
    return sa.bindparam(name, type_=type_)


def session_param() -> Any:
    """The ``session_id`` parameter every per-session statement takes."""
    return param("session_id", sa.String)


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
