"""`db upgrade` on SQLite in short transactions: the tables that revisions 0005, 0006, 0007
and 0010 rebuild are copied in batches while triggers carry what is written meanwhile, then
swapped in one short transaction. The result is the one-transaction upgrade's, schema and
rows; writes made between two batches (inserts, updates, deletes) are in the rebuilt table,
none lost or doubled; and an upgrade stopped anywhere in a rebuild, or killed, finishes
when run again, leaving nothing of the stopped run behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from tests.migrations.nonstop_writers import fill_released
from tests.migrations.released import released_database, rows, save_turns
from zerda_store import Store, migrate
from zerda_store.db.migration import sqlite_online

SESSIONS = {"a": [["Müller"], ["Muller"], ["Ada"]], "b": [["Zoë"], ["Zoe"]]}
# Small batches: every rebuilt table takes several.
BATCH_ROWS = 40
# Columns that hold the time a step ran, not data the upgrade carries.
RUN_TIMES = {"created_at", "raised_at", "reported_at"}
STEP_TABLES = ("entity_merges", "session_key_rules", "compatibility_floor")


class Stopped(Exception):
    """As a kill: the transaction under way is rolled back, nothing after it runs."""


def _released(path: Path) -> str:
    url = f"sqlite:///{path}"
    with Store(url) as store:
        released_database(store)
        for session_id, turns in SESSIONS.items():
            save_turns(store, session_id, turns)
        fill_released(store, sessions=4, turns_per_session=30, entities_per_session=6)
        with store.connect() as connection, connection.begin():
            # The newest turn deleted: AUTOINCREMENT never gives its id again.
            connection.exec_driver_sql("DELETE FROM turns WHERE id = (SELECT MAX(id) FROM turns)")
    return url


@pytest.fixture
def released(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A released database, and a copy of it upgraded in one transaction (as plain
    ``alembic upgrade`` does): what the short transactions must come to."""
    url = _released(tmp_path / "online.db")
    shutil.copy(tmp_path / "online.db", tmp_path / "reference.db")
    reference = f"sqlite:///{tmp_path / 'reference.db'}"
    with Store(reference) as store, migrate.locked_connection(store) as connection:
        command.upgrade(migrate.alembic_config(connection), "head")
    yield url, reference


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_online, "BATCH_ROWS", BATCH_ROWS)


def _schema(store: Store) -> list[tuple[Any, ...]]:
    """Every table, index and view, as its definition reads, but a table's constraints in
    sorted order (rebuilt once more, a table lists its foreign keys in another order)."""
    found = rows(
        store,
        "SELECT type, name, tbl_name, sql FROM sqlite_master "
        "WHERE name NOT LIKE 'sqlite_autoindex%' ORDER BY type, name",
    )
    return [(*row[:3], _constraints_sorted(row[3])) for row in found]


def _constraints_sorted(sql: str) -> tuple[str, ...]:
    lines = [line.strip().rstrip(",").strip() for line in sql.splitlines()]
    constraints = sorted(line for line in lines if line.startswith("CONSTRAINT"))
    return (*(line for line in lines if not line.startswith("CONSTRAINT")), *constraints)


def _contents(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows in id (or key) order, but the times at which steps ran."""
    contents = {}
    for table in sa.inspect(store.engine).get_table_names():
        columns = [
            column["name"]
            for column in sa.inspect(store.engine).get_columns(table)
            if not (table in STEP_TABLES and column["name"] in RUN_TIMES)
        ]
        listed = ", ".join(f'"{column}"' for column in columns)
        contents[table] = rows(store, f'SELECT {listed} FROM "{table}" ORDER BY {listed}')
    return contents


def _sequences(store: Store) -> dict[str, int]:
    """The highest id given in each AUTOINCREMENT table (none: 0)."""
    return {name: seq for name, seq in rows(store, "SELECT name, seq FROM sqlite_sequence") if seq}


def _leftovers(store: Store) -> list[tuple[Any, ...]]:
    return rows(store, "SELECT type, name FROM sqlite_master WHERE name GLOB '_online_*'")


def _same(url: str, reference: str) -> None:
    with Store(url) as store, Store(reference) as expected:
        assert migrate.current_revision(store) == migrate.head_revision()
        assert _schema(store) == _schema(expected)
        assert _contents(store) == _contents(expected)
        # The newest turn was deleted: its id is still counted, by both paths (batch
        # mode alone counts on from the newest turn left and would give its id again).
        [(newest,)] = rows(expected, "SELECT MAX(id) FROM turns")
        assert _sequences(expected)["turns"] == newest + 1
        assert _sequences(store) == _sequences(expected)
        assert _leftovers(store) == []
        migrate.check(store)
        assert rows(store, "PRAGMA integrity_check") == [("ok",)]


class Batches:
    """Each batch copied by a rebuild, by table, in order. ``stop(table, n)``: the
    ``n``-th batch of ``table`` fails (as a kill, its transaction rolled back);
    ``after(table, n, write)``: ``write`` runs once that batch is committed (another
    connection's write, between two batches)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.copied: list[str] = []
        self.stops: set[tuple[str, int]] = set()
        self.writes: dict[tuple[str, int], Callable[[], object]] = {}
        self.due: list[Callable[[], object]] = []
        batch, transaction = sqlite_online._Copy.batch, sqlite_online.short_transaction

        def counted(copy: Any, bind: sa.Connection, low: int, high: int) -> None:
            self.copied.append(copy.table)
            at = (copy.table, self.copied.count(copy.table))
            if at in self.stops:
                raise Stopped(f"stopped at batch {at[1]} of {at[0]}")
            batch(copy, bind, low, high)
            if at in self.writes:
                self.due.append(self.writes[at])

        @contextmanager
        def then_writes(bind: sa.Connection, pacing: Any) -> Iterator[None]:
            with transaction(bind, pacing):
                yield
            while self.due:
                self.due.pop()()

        monkeypatch.setattr(sqlite_online._Copy, "batch", counted)
        monkeypatch.setattr(sqlite_online, "short_transaction", then_writes)

    def stop(self, table: str, n: int) -> None:
        self.stops.add((table, n))

    def after(self, table: str, n: int, write: Callable[[], object]) -> None:
        self.writes[(table, n)] = write


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> Batches:
    return Batches(monkeypatch)


def test_the_upgrade_in_short_transactions_comes_to_the_one_transaction_upgrade(
    released: tuple[str, str], batches: Batches
) -> None:
    url, reference = released

    with Store(url) as store:
        report = migrate.upgrade(store)

    merged = [(entry["session_id"], m["merged"]) for entry in report for m in entry["merges"]]
    assert merged == [("a", "Muller"), ("b", "Zoe"), *[(f"s{n}", "Muller") for n in range(4)]]
    # 0005, 0007 and 0010 rebuild contexts (several batches each), 0006 and 0007 entities,
    # 0007 turns (its other tables are empty).
    assert set(batches.copied) == {"contexts", "entities", "turns"}
    assert batches.copied.count("contexts") > 3 * 3
    _same(url, reference)


@pytest.mark.parametrize(
    ("table", "batch"),
    [
        ("contexts", 1),  # 0005, as the copy begins
        ("contexts", 3),  # 0005, midway
        ("entities", 1),  # 0006, after its sessions were re-keyed
        ("turns", 2),  # 0007, the first of its tables
        ("entities", 2),  # 0007, turns swapped already
        ("contexts", 10),  # 0007, turns and entities swapped already
        ("contexts", 19),  # 0010
    ],
)
def test_an_upgrade_stopped_inside_a_rebuild_finishes_when_run_again(
    released: tuple[str, str], batches: Batches, table: str, batch: int
) -> None:
    url, reference = released
    batches.stop(table, batch)
    with Store(url) as store, pytest.raises(Stopped):
        migrate.upgrade(store)
    with Store(url) as store:
        # The new table and the triggers were committed: the stop left them behind.
        assert {name for _, name in _leftovers(store)} >= {
            f"_online_{table}",
            f"_online_{table}_insert",
        }
        assert migrate.current_revision(store) != migrate.head_revision()

    with Store(url) as store:
        migrate.upgrade(store)

    _same(url, reference)


# Written by the previous release between two batches of 0007's rebuild of contexts: a new
# turn with its snippet, a snippet edited and a turn deleted (its snippets with it) among
# the rows copied already.
WRITES = (
    "UPDATE contexts SET text = 'edited' WHERE id = (SELECT MIN(id) FROM contexts)",
    "DELETE FROM turns WHERE id = (SELECT MIN(id) FROM turns WHERE session_id = 's1')",
)
# The rows as written, whether before the upgrade or during it (an entity saved during it
# has the keys of the previous release until `db rekey`).
CARRIED = (
    "SELECT id, session_id, input_text, entity_names FROM turns",
    "SELECT id, session_id, name FROM entities",
    "SELECT id, session_id, entity_id, turn_id, turn_seq, text FROM contexts",
)


def _previous_release_writes(url: str) -> None:
    with Store(url) as store:
        save_turns(store, "a", [["Ada", "Grace"]])
        with store.connect() as connection, connection.begin():
            for statement in WRITES:
                connection.exec_driver_sql(statement)


def test_what_is_written_between_two_batches_is_in_the_rebuilt_table(
    released: tuple[str, str], batches: Batches, tmp_path: Path
) -> None:
    url, _ = released
    expected = f"sqlite:///{tmp_path / 'expected.db'}"
    shutil.copy(url.removeprefix("sqlite:///"), tmp_path / "expected.db")
    _previous_release_writes(expected)
    with Store(expected) as store:
        migrate.upgrade(store)
    batches.copied.clear()
    batches.after("contexts", 10, lambda: _previous_release_writes(url))

    with Store(url) as store:
        migrate.upgrade(store)

    assert batches.copied.count("contexts") > 10
    with Store(url) as store, Store(expected) as reference:
        for query in CARRIED:
            assert rows(store, f"{query} ORDER BY id") == rows(reference, f"{query} ORDER BY id")
        assert rows(store, "SELECT COUNT(*) FROM contexts WHERE text = 'edited'") == [(1,)]
        assert _leftovers(store) == []


# Run in a process of its own: the upgrade, each batch slowed down so that the test can
# kill it (SIGKILL) in the middle of a rebuild.
KILLED_UPGRADE = r"""
import sys, time
from zerda_store import Store, migrate
from zerda_store.db.migration import sqlite_online

sqlite_online.BATCH_ROWS = int(sys.argv[2])
batch = sqlite_online._Copy.batch

def slowly(copy, bind, low, high):
    batch(copy, bind, low, high)
    time.sleep(0.05)

sqlite_online._Copy.batch = slowly
with Store(sys.argv[1]) as store:
    migrate.upgrade(store)
"""


def _copying(url: str, table: str) -> bool:
    with Store(url) as store:
        found = rows(store, f"SELECT name FROM sqlite_master WHERE name = '_online_{table}'")
        return bool(found) and rows(store, f'SELECT COUNT(*) FROM "_online_{table}"')[0][0] > 0


def test_an_upgrade_killed_in_the_middle_of_a_rebuild_finishes_when_run_again(
    released: tuple[str, str], tmp_path: Path
) -> None:
    url, reference = released
    script = tmp_path / "upgrade.py"
    script.write_text(KILLED_UPGRADE, encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    upgrading = subprocess.Popen(
        [sys.executable, str(script), url, str(BATCH_ROWS)], env=environment
    )
    try:
        deadline = time.monotonic() + 60
        while not _copying(url, "turns") and time.monotonic() < deadline:
            assert upgrading.poll() is None, "the upgrade ended before it was killed"
            time.sleep(0.01)
    finally:
        upgrading.send_signal(signal.SIGKILL)
        upgrading.wait()
    with Store(url) as store:
        assert migrate.current_revision(store) == "0006"  # killed in 0007, copying turns
        assert ("table", "_online_turns") in _leftovers(store)

    with Store(url) as store:
        migrate.upgrade(store)

    _same(url, reference)
    assert not Path(f"{url.removeprefix('sqlite:///')}-migrating").exists()
