"""Editing SQLite table and index definitions without copying a table: dropping a
column's default, renaming an index.

A default lives only in the table's definition (``sqlite_schema.sql``); the rows do not
change when it goes. SQLite documents this edit of the definition for "adding, removing, or
changing default values on a column" (lang_altertable.html, "Making Other Kinds Of Table
Schema Changes"): in the transaction, ``writable_schema`` on, the definition updated, the
schema version raised by one. It takes as long as a save, where rebuilding the table (what
Alembic's batch mode does) holds the write lock while every row is copied.

One caution: a row stored before its table gained a column with ``ADD COLUMN`` does not hold
the column, and reads the default in its place. Every table this is used on was rebuilt by
revision 0007 since its columns were added, so its rows hold every column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy.engine import Connection

DEFAULT = " DEFAULT "


def drop_defaults(connection: Connection, columns: Sequence[tuple[str, str]]) -> bool:
    """Take the defaults of ``columns`` (``(table, column)``) out of their tables'
    definitions, in the connection's transaction; False, changing nothing, when a definition
    is not one this recognises (the caller rebuilds the table instead)."""
    edited: dict[str, str] = {}
    for table, column in columns:
        sql = edited.get(table) or _definition(connection, table)
        without = _without_default(sql, column) if sql else None
        if without is None:
            return False
        edited[table] = without
    version = int(connection.exec_driver_sql("PRAGMA schema_version").scalar_one())
    connection.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        for table, sql in edited.items():
            connection.exec_driver_sql(
                "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (sql, table)
            )
        connection.exec_driver_sql(f"PRAGMA schema_version = {version + 1}")
    finally:
        connection.exec_driver_sql("PRAGMA writable_schema = OFF")
    return all(_default_of(connection, table, column) is None for table, column in columns)


def rename_indexes(connection: Connection, renamed: Mapping[str, tuple[str, str]]) -> None:
    """Give indexes other names, in the connection's transaction: ``renamed`` maps each
    index's name to its new name and its ``CREATE INDEX`` under that name (same table,
    same columns). SQLite has no ALTER INDEX; an index's name lives only in the schema
    (its pages do not hold it), so the schema's row is edited as :func:`drop_defaults`
    edits a table's, and the schema version raised."""
    if not renamed:
        return
    version = int(connection.exec_driver_sql("PRAGMA schema_version").scalar_one())
    connection.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        for name, (new_name, sql) in renamed.items():
            connection.exec_driver_sql(
                "UPDATE sqlite_master SET name = ?, sql = ? WHERE type = 'index' AND name = ?",
                (new_name, sql, name),
            )
        connection.exec_driver_sql(f"PRAGMA schema_version = {version + 1}")
    finally:
        connection.exec_driver_sql("PRAGMA writable_schema = OFF")


def _definition(connection: Connection, table: str) -> str | None:
    row = connection.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).first()
    return None if row is None else str(row[0])


def _default_of(connection: Connection, table: str, column: str) -> object:
    for row in connection.exec_driver_sql(f'PRAGMA table_info("{table}")'):
        if row[1] == column:
            return row[4]
    raise LookupError(f"{table} has no column {column}")


def _without_default(sql: str, column: str) -> str | None:
    """``sql`` with the ``DEFAULT`` clause of ``column``'s line taken out: the line reads
    ``<column> <type> DEFAULT <a parenthesised expression or a quoted string> ...``, as
    SQLAlchemy writes it; None for anything else."""
    lines = sql.split("\n")
    for number, line in enumerate(lines):
        name, _, rest = line.strip().partition(" ")
        if name.strip('"') != column or DEFAULT not in f" {rest}":
            continue
        before, _, after = line.partition(DEFAULT)
        end = _end_of_value(after)
        if end is None:
            return None
        lines[number] = before + after[end:]
        return "\n".join(lines)
    return None


def _end_of_value(text: str) -> int | None:
    """Where the default's value that ``text`` begins with ends: a balanced parenthesised
    expression (strings inside it skipped) or one quoted string; None for anything else."""
    if text.startswith("'"):
        end = text.find("'", 1)
        while end != -1 and text[end + 1 : end + 2] == "'":
            end = text.find("'", end + 2)
        return None if end == -1 else end + 1
    if not text.startswith("("):
        return None
    depth, quoted = 0, False
    for index, char in enumerate(text):
        if char == "'":
            quoted = not quoted
        elif not quoted and char == "(":
            depth += 1
        elif not quoted and char == ")":
            depth -= 1
            if depth == 0:
                return index + 1
    return None
