"""What ``db check`` found, in words: Alembic's autogenerate differences (tuples of
SQLAlchemy objects) as one readable line each, naming tables, columns and types."""

from __future__ import annotations

from typing import Any

# The database side of each difference: autogenerate would "add" what the database
# lacks and "remove" what the code does not define.
_KINDS = {
    "add_table": "the table {0} is missing",
    "remove_table": "the database has a table {0} that the code does not define",
    "add_column": "the table {0} lacks the column {1}",
    "remove_column": "the table {0} has a column {1} that the code does not define",
    "add_index": "the index {0} is missing",
    "remove_index": "the database has an index {0} that the code does not define",
    "add_constraint": "the constraint {0} is missing",
    "remove_constraint": "the database has a constraint {0} that the code does not define",
    "add_fk": "the foreign key {0} is missing",
    "remove_fk": "the database has a foreign key {0} that the code does not define",
}


def describe(diffs: list[Any]) -> list[str]:
    """One line per difference (a column's several changes are several lines)."""
    lines: list[str] = []
    for diff in diffs:
        if isinstance(diff, list):
            lines.extend(describe(diff))
        else:
            lines.append(_line(diff))
    return lines


def _line(diff: tuple[Any, ...]) -> str:
    kind = diff[0]
    if kind in ("add_column", "remove_column"):
        column = diff[3]
        return _KINDS[kind].format(diff[2], f"{column.name} ({column.type})")
    if kind in _KINDS:
        return _KINDS[kind].format(_named(diff[1]))
    if kind == "modify_type":
        return f"the column {diff[2]}.{diff[3]} is {diff[5]} in the database, {diff[6]} in the code"
    if kind == "modify_nullable":
        return (
            f"the column {diff[2]}.{diff[3]} is {_nullable(diff[5])} in the database, "
            f"{_nullable(diff[6])} in the code"
        )
    if kind in ("modify_default", "modify_comment"):
        what = kind.removeprefix("modify_")
        return f"the column {diff[2]}.{diff[3]} has another {what} in the database"
    return f"{kind.replace('_', ' ')}: {', '.join(str(part) for part in diff[1:] if part)}"


def _named(thing: Any) -> str:
    """A table, index or constraint by its name, and for the last two, its table and
    columns."""
    name = getattr(thing, "name", None) or "(unnamed)"
    table = getattr(thing, "table", None)
    if table is None:
        return str(name)
    columns = [column.name for column in getattr(thing, "columns", ())]
    return f"{name} on {table.name} ({', '.join(columns)})"


def _nullable(value: object) -> str:
    return "nullable" if value else "NOT NULL"
