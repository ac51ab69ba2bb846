"""The steps of a rolling deploy against writers that never pause: two servers of the
released version saving back to back (a few hundred saves a second) in the sessions that
re-keying merges, through ``db upgrade`` and ``db rekey``, then two of this version through
``db contract``. Every save is acknowledged, and every acknowledged save keeps its turn and
its snippet; every revision finishes without running out of tries. On SQLite, no
transaction of ``db upgrade`` writes more than one batch of rows: the write lock is held
one batch at a time (the waits themselves are the benchmark's to report).

Bounded: a few thousand turns, a few seconds of writing per step."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.migrations.nonstop_writers import (
    WriteTransactions,
    against_nonstop_writers,
    assert_nothing_lost,
    fill_released,
    upgrade_against_nonstop_writers,
)
from tests.migrations.released import released_database, rows, save_turns
from zerda_store import Store, migrate
from zerda_store.db.execution import pacing
from zerda_store.db.migration import lock_waits, sqlite_online
from zerda_store.identity.rekeying import Rekeying

pytestmark = pytest.mark.slow

SESSIONS = 200
TURNS_PER_SESSION = 20  # 4,000 turns, 8,000 snippets, 200 merges by 0006
# The merged entity ("Muller", seen after "Müller") and the kept one, by the released
# version's keys.
NAMES = ["Muller", "Müller"]
# Fewer tries than db upgrade's three minutes: a revision that cannot get its locks past
# the writers fails the test in seconds rather than minutes.
RETRY_PAUSES = (0.5, 1.0, 2.0)
# SQLite: rows per transaction of a table rebuild; the 8,000 snippets take 16.
SQLITE_BATCH_ROWS = 500


@pytest.fixture
def released_url(empty_database_url: str) -> Iterator[str]:
    with Store(empty_database_url) as store:
        released_database(store)
        fill_released(store, sessions=SESSIONS, turns_per_session=TURNS_PER_SESSION)
    yield empty_database_url


def _sessions() -> list[str]:
    return [f"s{n}" for n in range(SESSIONS)]


def test_db_upgrade_finishes_and_loses_no_save_of_the_previous_release(
    released_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock_waits, "RETRY_PAUSES", RETRY_PAUSES)
    monkeypatch.setattr(sqlite_online, "BATCH_ROWS", SQLITE_BATCH_ROWS)
    transactions: list[WriteTransactions] = []

    def upgrade() -> list[dict[str, object]]:
        with Store(released_url) as store:
            if store.dialect == "sqlite":
                transactions.append(WriteTransactions(store.engine))
            return migrate.upgrade(store)

    # Every save names the entity that re-keying merges away.
    sessions = _sessions()
    report, writers = against_nonstop_writers(
        released_url, tmp_path, upgrade, sessions=sessions, names=["Muller"]
    )

    assert sum(len(entry["merges"]) for entry in report) == len(sessions)  # type: ignore[arg-type]
    assert_nothing_lost(writers)
    print("the released version's saves during db upgrade:", writers.summary())
    with Store(released_url) as store:
        assert migrate.current_revision(store) == migrate.head_revision()
    for written in transactions:  # SQLite: the write lock held for one batch at a time
        print("the longest write transaction of db upgrade:", written.longest())
        assert max(changed for changed, _ in written.done) <= SQLITE_BATCH_ROWS
        # Among them, the three copies of every snippet (0005, 0007 and 0010 rebuild them).
        with Store(released_url) as store:
            [(snippets,)] = rows(store, "SELECT COUNT(*) FROM contexts")
        assert sum(changed for changed, _ in written.done) > 3 * snippets


def test_db_rekey_loses_no_save_of_the_previous_release(released_url: str, tmp_path: Path) -> None:
    # "Müller" is "muller" under the new keys: once its session is re-keyed, the released
    # version, which looks it up as "müller", saves a second entity, which db rekey merges
    # away while the writers keep naming it.
    def upgrade() -> None:
        with Store(released_url) as store:
            migrate.upgrade(store)
        time.sleep(1)

    def rekey() -> int:
        with Store(released_url) as store:
            return sum(len(done.merges) for done in Rekeying(store).run(time.time))

    merges, writers = against_nonstop_writers(
        released_url,
        tmp_path,
        rekey,
        before=upgrade,
        sessions=_sessions()[:20],
        names=["Müller"],
    )

    assert merges >= 20
    assert_nothing_lost(writers)


def test_db_contract_keeps_every_save_of_this_version(released_url: str, tmp_path: Path) -> None:
    with Store(released_url) as store:
        migrate.upgrade(store)

    def contract() -> list[str]:
        with Store(released_url) as store:
            return migrate.contract(store)

    dropped, writers = against_nonstop_writers(
        released_url,
        tmp_path,
        contract,
        sessions=_sessions(),
        names=NAMES,
        release="current",
    )

    assert dropped == ["contexts.created_at", "entities.core_key"]
    assert_nothing_lost(writers)
    with Store(released_url) as store:
        assert rows(store, "SELECT COUNT(*) FROM entities WHERE core_key = ''") == [(0,)]


REVISIONS = ["0005", "0006", "0007", "0008", "0009", "0010", "0011", "0012", "0013", "0014"]


@pytest.mark.parametrize("revision", REVISIONS)
def test_each_revision_finishes_under_nonstop_writers_of_the_previous_release(
    revision: str, empty_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each revision from now on joins this list (the helper runs it against writers)."""
    monkeypatch.setattr(lock_waits, "RETRY_PAUSES", RETRY_PAUSES)
    with Store(empty_database_url) as store:
        released_database(store)
        fill_released(store, sessions=50, turns_per_session=TURNS_PER_SESSION)

    upgrade_against_nonstop_writers(
        empty_database_url, tmp_path, revision, sessions=[f"s{n}" for n in range(50)], names=NAMES
    )


def test_db_rekey_on_sqlite_pauses_between_sessions_for_the_waiting_writers(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's writers poll for the write lock: back-to-back transactions would starve
    them, so the re-keying pauses once it has held the lock for ``pacing.HOLD``."""
    with Store(sqlite_url) as store:
        released_database(store)
        sessions = fill_released(store, sessions=3, turns_per_session=TURNS_PER_SESSION)
        migrate.upgrade(store)
        save_turns(store, "s0", [["Müller"]])  # as the released version: no core yet
        save_turns(store, "s1", [["Müller"]])
        save_turns(store, "s2", [["Müller"]])
        monkeypatch.setattr(pacing, "HOLD", 0.0)
        pauses: list[float] = []
        monkeypatch.setattr(pacing.time, "sleep", pauses.append)

        done = list(Rekeying(store).run(time.time))

    assert [session.session_id for session in done] == sessions
    assert pauses == [pacing.PAUSE] * 3
