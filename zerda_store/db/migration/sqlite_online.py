"""SQLite schema steps in short transactions, for `db upgrade` under live writes.

SQLite has one writer at a time: a revision run in one transaction holds the write lock
for all of it, and a save waiting for it fails past its busy timeout. When `db upgrade`
runs the revisions of a SQLite database one transaction each (``online_ddl``, see
``migrations/env.py``), a revision with a long data step runs that step here, between
two commits of its own transaction (:func:`apart`): in short transactions, each holding
the write lock for one batch, paced so that waiting saves get the lock in between
(:class:`~zerda_store.db.execution.pacing.WriterPacing`).

A table rebuild (what batch mode does to change a table's constraints or keys, which
SQLite cannot alter in place) becomes :func:`rebuild_table`:

1. the new table's definition and indexes are batch mode's own, computed by running the
   batch operation on an empty copy of the schema in memory;
2. one short transaction creates the new table under another name, its indexes (under
   names of their own: the old table's still hold the final ones), and triggers on the
   old table that carry every insert, update and delete made meanwhile into the new one;
3. the rows are copied in batches in key order, each batch a transaction of its own
   (a row a trigger already carried is replaced by the same row);
4. one short transaction checks that both tables hold as many rows, drops the old table
   (its triggers and indexes with it), renames the new one, gives its indexes their final
   names, and creates the views again (SQLite checks them when a table is renamed).

Interrupted anywhere, the rebuild leaves the old table in use (at worst with the new
one and its triggers beside it, which the next run drops before it starts again) or the
new one swapped in: the revision, run again, goes on from there.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..execution.pacing import WriterPacing
from . import sqlite_schema

if TYPE_CHECKING:
    from alembic.operations import BatchOperations

# The prefix of the new table, its indexes and the old table's triggers while a rebuild runs.
BUILDING = "_online_"
# Rows copied per transaction.
BATCH_ROWS = 5_000
# What a column of the new table takes from a row of the old one, written with ``{row}``
# for the row (``NEW`` in a trigger, the old table in a batch): by default its own value.
Values = Mapping[str, str]
Alter = Callable[["BatchOperations"], None]


@contextmanager
def apart(bind: Connection) -> Iterator[WriterPacing]:
    """Commit the revision's transaction, let the caller run short transactions of its own
    (:func:`short_transaction`, paced by the pacing yielded), then begin the revision's
    transaction again for what follows (the rest of the revision, and its version stamp).

    Alembic's transaction stays open as far as SQLAlchemy knows: the commits are the
    driver's, and the final commit or rollback is Alembic's as usual."""
    driver = bind.connection.driver_connection
    assert driver is not None
    if driver.in_transaction:
        bind.exec_driver_sql("COMMIT")
    yield WriterPacing("sqlite")
    bind.exec_driver_sql("BEGIN IMMEDIATE")


@contextmanager
def short_transaction(bind: Connection, pacing: WriterPacing) -> Iterator[None]:
    """One write transaction (inside :func:`apart`), then a pause if the job has held the
    write lock long enough since its last one."""
    bind.exec_driver_sql("BEGIN IMMEDIATE")
    began = time.monotonic()
    try:
        yield
    except BaseException:
        bind.exec_driver_sql("ROLLBACK")
        raise
    bind.exec_driver_sql("COMMIT")
    pacing.after(time.monotonic() - began)


def rebuild_table(
    bind: Connection,
    table: str,
    alter: Alter,
    pacing: WriterPacing,
    *,
    table_kwargs: Mapping[str, Any] | None = None,
    values: Values | None = None,
) -> None:
    """Rebuild ``table`` as ``op.batch_alter_table(table, recreate="always")`` with
    ``alter`` (called with the batch) would, in short transactions (inside :func:`apart`;
    see the module's docstring). ``table_kwargs``: as batch mode's (AUTOINCREMENT is kept
    unless they say otherwise); ``values``: the columns not copied as they are."""
    target = _target(bind, table, alter, table_kwargs or {})
    copy = _Copy(table, target, values or {})
    with short_transaction(bind, pacing):
        copy.start(bind)
        low, high = bind.exec_driver_sql(f'SELECT MIN(id), MAX(id) FROM "{table}"').one()
    # Rows inserted after this are carried by the triggers.
    for start in range(low or 0, (high or -1) + 1, BATCH_ROWS):
        with short_transaction(bind, pacing):
            copy.batch(bind, start, start + BATCH_ROWS)
    with short_transaction(bind, pacing):
        copy.swap(bind)


@dataclass
class _Target:
    """The rebuilt table as batch mode leaves it: its definition, columns and indexes
    (each name's ``CREATE INDEX``)."""

    definition: str
    columns: list[str]
    indexes: dict[str, str]


def _target(bind: Connection, table: str, alter: Alter, table_kwargs: Mapping[str, Any]) -> _Target:
    """Run the batch operation on an empty copy of the schema, and read what it made."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    schema = bind.exec_driver_sql(
        "SELECT type, sql FROM sqlite_master WHERE type IN ('table', 'index') "
        "AND sql IS NOT NULL AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
        "AND name NOT GLOB ? ORDER BY type = 'index'",
        (f"{BUILDING}*",),
    ).all()
    kept = {"sqlite_autoincrement": _autoincrement(_definition(bind, table))}
    scratch = sa.create_engine("sqlite://")
    try:
        with scratch.connect() as connection:
            for _, sql in schema:
                connection.exec_driver_sql(sql)
            operations = Operations(MigrationContext.configure(connection))
            with operations.batch_alter_table(
                table, recreate="always", table_kwargs={**kept, **table_kwargs}
            ) as batch:
                alter(batch)
            definition = _definition(connection, table)
            columns = _column_names(connection, table)
            indexes: dict[str, str] = {
                name: sql
                for name, sql in connection.exec_driver_sql(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
                    "AND sql IS NOT NULL",
                    (table,),
                )
            }
    finally:
        scratch.dispose()
    return _Target(definition, columns, indexes)


def _column_names(connection: Connection, table: str) -> list[str]:
    return [row[1] for row in connection.exec_driver_sql(f'PRAGMA table_info("{table}")')]


def _definition(connection: Connection, table: str) -> str:
    return str(
        connection.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).scalar_one()
    )


def _autoincrement(definition: str) -> bool:
    return re.search(r"\bAUTOINCREMENT\b", definition, re.IGNORECASE) is not None


_TABLE_NAME = re.compile(r'^\s*CREATE\s+TABLE\s+("[^"]+"|[^\s(]+)', re.IGNORECASE)
_INDEX_NAMES = re.compile(
    r'^(\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+)("[^"]+"|\S+)(\s+ON\s+)("[^"]+"|[^\s(]+)', re.IGNORECASE
)


class _Copy:
    """The statements of one rebuild: the new table beside the old, its triggers, the
    batches and the swap."""

    def __init__(self, table: str, target: _Target, values: Values) -> None:
        self.table = table
        self.target = target
        self.new = f"{BUILDING}{table}"
        self.triggers = [f"{BUILDING}{table}_{change}" for change in ("insert", "update", "delete")]
        self.values = values
        self.index_names = {f"{BUILDING}{name}": name for name in target.indexes}
        self.select = ""  # the batches' SELECT, once the old table's columns are read

    def _columns(self) -> str:
        return ", ".join(f'"{column}"' for column in self.target.columns)

    def _values(self, row: str, old_columns: set[str]) -> str:
        expressions = []
        for column in self.target.columns:
            if column in self.values:
                expressions.append(self.values[column].format(row=row))
            elif column in old_columns:
                expressions.append(f'{row}."{column}"')
            else:
                raise ValueError(f"no value for {self.table}.{column} in the rebuilt table")
        return ", ".join(expressions)

    def start(self, bind: Connection) -> None:
        """Drop what an interrupted run left, then create the new table, its indexes and
        the old table's triggers."""
        for trigger in self.triggers:
            bind.exec_driver_sql(f'DROP TRIGGER IF EXISTS "{trigger}"')
        bind.exec_driver_sql(f'DROP TABLE IF EXISTS "{self.new}"')
        created = _TABLE_NAME.sub(f'CREATE TABLE "{self.new}"', self.target.definition, 1)
        bind.exec_driver_sql(created)
        for building, name in self.index_names.items():
            bind.exec_driver_sql(self._index_of_new(self.target.indexes[name], building))
        old_columns = set(_column_names(bind, self.table))
        quoted = f'"{self.table}"'
        self.select = f"SELECT {self._values(quoted, old_columns)} FROM {quoted}"
        carried = (
            f'INSERT INTO "{self.new}" ({self._columns()}) '
            f"VALUES ({self._values('NEW', old_columns)});"
        )
        insert, update, delete = self.triggers
        bind.exec_driver_sql(
            f'CREATE TRIGGER "{insert}" AFTER INSERT ON "{self.table}" BEGIN '
            f'DELETE FROM "{self.new}" WHERE id = NEW.id; {carried} END'
        )
        bind.exec_driver_sql(
            f'CREATE TRIGGER "{update}" AFTER UPDATE ON "{self.table}" BEGIN '
            f'DELETE FROM "{self.new}" WHERE id IN (OLD.id, NEW.id); {carried} END'
        )
        bind.exec_driver_sql(
            f'CREATE TRIGGER "{delete}" AFTER DELETE ON "{self.table}" BEGIN '
            f'DELETE FROM "{self.new}" WHERE id = OLD.id; END'
        )

    def _index_of_new(self, sql: str, name: str) -> str:
        """``CREATE INDEX`` of the new table, under ``name``."""
        return _INDEX_NAMES.sub(lambda found: f'{found[1]}"{name}"{found[3]}"{self.new}"', sql, 1)

    def batch(self, bind: Connection, low: int, high: int) -> None:
        bind.exec_driver_sql(
            f'INSERT OR REPLACE INTO "{self.new}" ({self._columns()}) {self.select} '
            f'WHERE "{self.table}".id >= ? AND "{self.table}".id < ? ORDER BY "{self.table}".id',
            (low, high),
        )

    def swap(self, bind: Connection) -> None:
        """Put the new table in the old one's place (see the module's docstring)."""
        old, new = (
            bind.exec_driver_sql(f'SELECT COUNT(*) FROM "{name}"').scalar_one()
            for name in (self.table, self.new)
        )
        if old != new:
            raise RuntimeError(
                f"rebuilding {self.table}: {new} rows copied, {old} in the table; nothing "
                "was swapped: run the upgrade again"
            )
        views = bind.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY rowid"
        ).all()
        for name, _ in reversed(views):
            bind.exec_driver_sql(f'DROP VIEW "{name}"')
        self._keep_sequence(bind)
        bind.exec_driver_sql(f'DROP TABLE "{self.table}"')  # and its triggers and indexes
        bind.exec_driver_sql(f'ALTER TABLE "{self.new}" RENAME TO "{self.table}"')
        sqlite_schema.rename_indexes(
            bind, {building: (name, self.target.indexes[name])
                   for building, name in self.index_names.items()},
        )  # fmt: skip
        for _, sql in views:
            bind.exec_driver_sql(sql)

    def _keep_sequence(self, bind: Connection) -> None:
        """AUTOINCREMENT counts on from the old table's highest id ever given, not from
        the highest row left (ids are never reused)."""
        if not _autoincrement(self.target.definition):
            return
        counted = bind.exec_driver_sql(
            "SELECT seq FROM sqlite_sequence WHERE name = ?", (self.table,)
        ).scalar()
        if counted is None:
            return
        copied = bind.exec_driver_sql(
            "SELECT seq FROM sqlite_sequence WHERE name = ?", (self.new,)
        ).scalar()
        bind.exec_driver_sql("DELETE FROM sqlite_sequence WHERE name = ?", (self.new,))
        bind.exec_driver_sql(
            "INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)",
            (self.new, max(counted, copied or 0)),
        )
