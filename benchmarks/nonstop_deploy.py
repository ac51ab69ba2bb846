"""A rolling deploy against writers that never pause: two servers of the released version
(revision 0004) saving back to back through ``db upgrade`` and ``db rekey``, then two
servers of this version through ``db contract``, on a database filled as the released
version left it.

    python -m benchmarks.nonstop_deploy                               # Postgres, 200,000 turns
    python -m benchmarks.nonstop_deploy --backend sqlite --turns 100000

Each writer names, turn after turn, "Muller" and "Müller" (one key under the new rules:
the upgrade merges the two entities of every session, and ``db rekey`` merges the second
"Müller" that the released version saves after that) in every session, round robin. Once
the released servers have stopped, ``db rekey`` runs again (what they saved after the first
one), as the procedure has it, before ``db contract``. Prints
each step's time (and how often a revision gave way to another transaction's lock and
tried again), then per step what the writers saw: saves, failures, the longest save, the
saves over 1 s, and the acknowledged saves whose turn or snippet the database lost. On
SQLite, also the write transactions of ``db upgrade``: how many, and the one that held the
write lock longest (seconds, rows written).
Needs the released version's environment (built on first use, as the migration tests
build it). A Postgres database ``zerda_test_<random>`` is made and dropped.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks.databases import POSTGRES_ADMIN_URL
from benchmarks.upgrade_locks import RevisionClock
from tests.doubles import new_postgres_database
from tests.migrations.nonstop_writers import NonStopWriters, WriteTransactions, fill_released
from tests.migrations.released import released_database
from zerda_store import Store, migrate
from zerda_store.identity.rekeying import Rekeying

TURNS_PER_SESSION = 1000
ENTITIES_PER_SESSION = 100
NAMES = ["Muller", "Müller"]
SETTLE_S = 2.0


def _timed(step: Callable[[], Any]) -> tuple[float, float, Any]:
    started = time.time()
    result = step()
    return started, time.time(), result


def _watched(store: Store) -> WriteTransactions | None:
    """SQLite: the write transactions of the store's connections, recorded."""
    return WriteTransactions(store.engine) if store.dialect == "sqlite" else None


def _rekey(url: str) -> int:
    with Store(url) as store:
        return sum(len(done.merges) for done in Rekeying(store).run(time.time))


def _upgrade(url: str, locks: dict[str, Any]) -> tuple[int, int, dict[str, float]]:
    with Store(url) as store, RevisionClock() as clock:
        watched = _watched(store)
        started = time.monotonic()
        report = migrate.upgrade(store)
        durations = clock.durations(time.monotonic() - started)
    if watched is not None:
        locks["db upgrade"] = watched.longest()
    return sum(len(entry["merges"]) for entry in report), clock.retries, durations


def _contract(url: str) -> list[str]:
    with Store(url) as store:
        return migrate.contract(store)


def _seen(writers: NonStopWriters, store: Store, during: tuple[float, float]) -> dict[str, Any]:
    summary = writers.report(store, during).summary()
    seconds = max(during[1] - during[0], 1e-9)
    return {**summary, "saves_per_s": round(summary["saves"] / seconds)}


def measure(url: str, turns: int, workdir: Path) -> dict[str, Any]:
    with Store(url) as store:
        released_database(store)
        started = time.monotonic()
        sessions = fill_released(
            store,
            sessions=max(1, turns // TURNS_PER_SESSION),
            turns_per_session=min(turns, TURNS_PER_SESSION),
            entities_per_session=ENTITIES_PER_SESSION,
        )
        filled = time.monotonic() - started
    steps: dict[str, Any] = {}
    locks: dict[str, Any] = {}
    released = NonStopWriters(url, workdir, sessions=sessions, names=NAMES)
    with released:
        time.sleep(SETTLE_S)
        upgrade_from, upgrade_to, (merges, retries, revisions) = _timed(
            lambda: _upgrade(url, locks)
        )
        time.sleep(SETTLE_S)
        rekey_from, rekey_to, rekey_merges = _timed(lambda: _rekey(url))
        time.sleep(SETTLE_S)
    # The released servers have stopped: what they saved after the first db rekey is
    # re-keyed now (the procedure's db rekey), before the contract.
    left = _rekey(url)
    current = NonStopWriters(url, workdir, sessions=sessions, names=NAMES, release="current")
    with current:
        time.sleep(SETTLE_S)
        contract_from, contract_to, dropped = _timed(lambda: _contract(url))
        time.sleep(SETTLE_S)
    with Store(url) as store:
        steps["db upgrade"] = {
            "seconds": round(upgrade_to - upgrade_from, 1), "merges": merges,
            "lock_retries": retries, "revisions_s": revisions,
            "released_writers": _seen(released, store, (upgrade_from, upgrade_to)),
        }  # fmt: skip
        steps["db rekey"] = {
            "seconds": round(rekey_to - rekey_from, 1), "merges": rekey_merges,
            "released_writers": _seen(released, store, (rekey_from, rekey_to)),
            "merges_after_the_released_servers_stopped": left,
        }  # fmt: skip
        steps["db contract"] = {
            "seconds": round(contract_to - contract_from, 2), "dropped": dropped,
            "current_writers": _seen(current, store, (contract_from, contract_to)),
        }  # fmt: skip
        everything = {
            "released_writers": released.report(store).summary(),
            "current_writers": current.report(store).summary(),
        }
    for step, held in locks.items():
        steps[step]["write_transactions"] = held
    return {"turns": turns, "fill_s": round(filled, 1), "steps": steps, "all_saves": everything}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--turns", type=int, default=200_000)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        if arguments.backend == "sqlite":
            result = measure(f"sqlite:///{workdir / 'deploy.db'}", arguments.turns, workdir)
        else:
            admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
            url, drop = new_postgres_database(admin)
            try:
                result = measure(url, arguments.turns, workdir)
            finally:
                drop()
                admin.dispose()
    print(json.dumps({"backend": arguments.backend, **result}, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
