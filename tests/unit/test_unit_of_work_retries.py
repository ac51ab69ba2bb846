"""How often a unit of work runs: once when it succeeds, again after a lost connection
(at most ``WRITE_ATTEMPTS`` times in all), never again after any other driver error."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zerda_store import DatabaseError, DatabaseUnavailableError
from zerda_store.db.execution import unit_of_work
from zerda_store.db.execution.failures import WRITE_ATTEMPTS
from zerda_store.db.execution.unit_of_work import Transaction
from zerda_store.db.store import StoreCore

pytestmark = pytest.mark.filterwarnings("error::sqlalchemy.exc.SAWarning")

# What SQLite's driver raises on a closed connection (SQLAlchemy counts it as lost).
LOST = "Cannot operate on a closed database."


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreCore]:
    monkeypatch.setattr(unit_of_work, "backoff", lambda _number: 0.0)
    with StoreCore(f"sqlite:///{tmp_path / 'memory.db'}") as opened:
        yield opened


def _failing(times: int, error: Exception) -> tuple[Callable[[Transaction], int], list[int]]:
    """A unit of work that raises ``error`` on its first ``times`` runs, then returns 42;
    and the list its runs are counted in."""
    runs: list[int] = []

    def work(transaction: Transaction) -> int:
        runs.append(1)
        if len(runs) <= times:
            raise error
        return 42

    return work, runs


@pytest.mark.parametrize("snapshot", [False, True], ids=["plain", "snapshot"])
def test_a_read_runs_once_when_it_succeeds(store: StoreCore, snapshot: bool) -> None:
    work, runs = _failing(0, AssertionError())
    assert unit_of_work.read(store, work, snapshot=snapshot) == 42
    assert len(runs) == 1
    assert store.connections_in_use() == 0  # given back


@pytest.mark.parametrize("call", ["read", "write"])
def test_a_lost_connection_runs_the_unit_again(store: StoreCore, call: str) -> None:
    work, runs = _failing(1, sqlite3.ProgrammingError(LOST))
    assert getattr(unit_of_work, call)(store, work) == 42
    assert len(runs) == 2


@pytest.mark.parametrize("call", ["read", "write"])
def test_a_connection_lost_on_every_attempt_is_unavailable(store: StoreCore, call: str) -> None:
    work, runs = _failing(WRITE_ATTEMPTS + 1, sqlite3.ProgrammingError(LOST))
    with pytest.raises(DatabaseUnavailableError, match="on every attempt"):
        getattr(unit_of_work, call)(store, work)
    assert len(runs) == WRITE_ATTEMPTS


@pytest.mark.parametrize("call", ["read", "write"])
def test_any_other_driver_error_is_not_run_again(store: StoreCore, call: str) -> None:
    work, runs = _failing(1, sqlite3.OperationalError("no such table: elsewhere"))
    with pytest.raises(DatabaseError, match="no such table: elsewhere"):
        getattr(unit_of_work, call)(store, work)
    assert len(runs) == 1
    assert store.connections_in_use() == 0


def test_no_unit_of_work_runs_past_its_last_attempt(
    store: StoreCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unit_of_work, "failure", lambda *_args: None)  # "run it again", always
    work, runs = _failing(WRITE_ATTEMPTS + 1, sqlite3.ProgrammingError(LOST))
    with pytest.raises(AssertionError, match="past its last attempt"):
        unit_of_work.read(store, work)
    assert len(runs) == WRITE_ATTEMPTS
