"""Only `db upgrade`, `import`, `copy`'s destination and `demo` create or upgrade a schema
(the fourth hardening round, H7): every other command refuses a SQLite database behind
head, naming `db upgrade`, and leaves it at its revision; a mistyped SQLite path is an
error, never a new database."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import invoke, one_line_error
from zerda_store import Store, migrate

CHANGING_COMMANDS = [
    ("db", "contract"),
    ("db", "rekey"),
    ("retention", "show", "--default"),
    ("retention", "set", "--default", "--keep-last", "3"),
    ("retention", "clear", "--yes", "--default"),
    ("prune", "--dry-run"),
    (
        "prune",
        "--yes",
    ),
    ("forget", "--yes", "Sarah", "--session", "s"),
    ("alias", "add", "Sarah", "Sal", "--session", "s"),
]


def _revision(url: str) -> str | None:
    with Store(url) as store:
        return migrate.current_revision(store)


@pytest.mark.parametrize("args", CHANGING_COMMANDS, ids=" ".join)
def test_a_command_refuses_a_sqlite_schema_behind_head_and_leaves_it(sqlite_url, args):
    with Store(sqlite_url) as store:
        migrate.upgrade(store, "0004")

    line = one_line_error(invoke(sqlite_url, *args))

    assert "db upgrade" in line
    assert _revision(sqlite_url) == "0004"


MISSING_FILE_COMMANDS = [
    *CHANGING_COMMANDS,
    ("db", "downgrade", "base", "--yes"),
    ("sessions",),
    ("db", "current"),
]


@pytest.mark.parametrize("args", MISSING_FILE_COMMANDS, ids=" ".join)
def test_a_mistyped_sqlite_path_is_an_error_not_a_new_database(tmp_path, args):
    path = tmp_path / "mistyped.db"

    line = one_line_error(invoke(f"sqlite:///{path}", *args))

    assert f"no database file at {path}" in line
    assert list(Path(tmp_path).iterdir()) == []
