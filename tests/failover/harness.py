"""Failover harness: writers save turns through a multi-host URL while the primary of a
pg_auto_failover formation is killed; the application carries on, on the promoted standby,
without a restart.

    python -m tests.failover.harness [--writers 4] [--before 150] [--after 1.0]

Each writer is a thread of this one process, sharing one :class:`Store`, saving turns of its
own session with an idempotency key each. A call that raises (the server is gone, no server
accepts writes yet, or ``CommitOutcomeUnknownError``: the commit's fate is unknown) is
delivered again with the same key, as the README tells applications to do; a turn counts as
acknowledged once ``save_context`` returned. After the promotion the harness checks that
every acknowledged turn is stored, none twice, each with its snippets and ledger row, and
prints how long no write was acknowledged. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

from tests.doubles import NamesExtractor
from tests.failover.cluster import Cluster, ClusterError, formation
from zerda_store import ConversationEntityMemory, Store, migrate
from zerda_store.db.schema import contexts, extractions, turns
from zerda_store.errors import StoreError

NAMES = ("Alice Harper", "Bilal Haddad")
RECOVERY_SECONDS = 120
PAUSE_BETWEEN_DELIVERIES = 0.05


class RetryCount(logging.Handler):
    """Counts the library's own retries (logged as warnings) instead of printing each."""

    count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


RETRIES = RetryCount()


@dataclass
class Writer:
    """One writer's acknowledged turns (key, when) and the errors it retried after."""

    number: int
    acknowledged: list[tuple[str, float]] = field(default_factory=list)
    retried: Counter[str] = field(default_factory=Counter)
    failure: BaseException | None = None

    @property
    def session_id(self) -> str:
        return f"writer-{self.number}"

    def run(self, store: Store, stop: threading.Event) -> None:
        memory = ConversationEntityMemory(
            extractor=NamesExtractor(NAMES), store=store, session_id=self.session_id
        )
        try:
            turn = 0
            while not stop.is_set():
                key = f"w{self.number}-t{turn}"
                self._deliver(memory, key)
                self.acknowledged.append((key, time.monotonic()))
                turn += 1
        except BaseException as exc:
            self.failure = exc

    def _deliver(self, memory: ConversationEntityMemory, key: str) -> None:
        """Save the turn; after an error, deliver it again with the same key until it is
        acknowledged (for at most RECOVERY_SECONDS)."""
        deadline = time.monotonic() + RECOVERY_SECONDS
        while True:
            try:
                memory.save_context(
                    {"input": f"[{key}] {NAMES[0]} met {NAMES[1]}."},
                    {"output": "Noted."},
                    idempotency_key=key,
                )
                return
            except (StoreError, sa.exc.DBAPIError) as exc:
                self.retried[type(exc).__name__] += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(PAUSE_BETWEEN_DELIVERIES)


@dataclass
class Outcome:
    """What the run measured, and the checks with whether each passed."""

    checks: dict[str, bool]
    figures: dict[str, str]


def run(writers: int, before: int, after: float) -> Outcome:
    started = time.monotonic()
    with formation() as cluster:
        ready = time.monotonic()
        with Store(cluster.url) as store:
            migrate.upgrade(store)
            outcome = _fail_over_under_writes(cluster, store, writers, before, after)
        outcome.figures["formation set up in"] = f"{ready - started:.1f} s"
    outcome.figures["harness run time"] = f"{time.monotonic() - started:.1f} s"
    return outcome


def _fail_over_under_writes(
    cluster: Cluster, store: Store, count: int, before: int, after: float
) -> Outcome:
    stop = threading.Event()
    writers = [Writer(number) for number in range(count)]
    threads = [threading.Thread(target=w.run, args=(store, stop), daemon=True) for w in writers]
    for thread in threads:
        thread.start()
    _wait(lambda: sum(len(w.acknowledged) for w in writers) >= before or _failed(writers))
    killed_at = time.monotonic()
    primary = cluster.nodes[0]
    primary.kill()
    _wait(lambda: all(_after(w, killed_at) for w in writers) or _failed(writers))
    time.sleep(after)
    stop.set()
    for thread in threads:
        thread.join(RECOVERY_SECONDS)
    return _check(cluster, store, writers, killed_at)


def _wait(condition: Callable[[], bool], timeout: float = RECOVERY_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def _failed(writers: list[Writer]) -> bool:
    return any(w.failure is not None for w in writers)


def _after(writer: Writer, moment: float) -> bool:
    return bool(writer.acknowledged) and writer.acknowledged[-1][1] > moment


def _check(cluster: Cluster, store: Store, writers: list[Writer], killed_at: float) -> Outcome:
    acknowledged = Counter((w.session_id, key) for w in writers for key, _ in w.acknowledged)
    with store.connect() as connection:
        port = connection.exec_driver_sql("SELECT inet_server_port()").scalar()
        stored = Counter(
            (row.session_id, row.idempotency_key)
            for row in connection.execute(sa.select(turns.c.session_id, turns.c.idempotency_key))
        )
        inputs = Counter(connection.execute(sa.select(turns.c.input_text)).scalars())
        snippets = connection.execute(sa.select(sa.func.count()).select_from(contexts)).scalar()
        ledger = connection.execute(sa.select(sa.func.count()).select_from(extractions)).scalar()
    times = sorted(moment for w in writers for _, moment in w.acknowledged)
    # The outage: the longest stretch with no write acknowledged (a commit under way at the
    # kill may still be acknowledged just after it).
    gap, gap_start = max(
        ((later - earlier, earlier) for earlier, later in itertools.pairwise(times)),
        default=(float("nan"), killed_at),
    )
    retried = sum((w.retried for w in writers), Counter[str]())
    checks = {
        "every writer went on after the primary was killed, without a restart": all(
            w.failure is None and _after(w, killed_at) for w in writers
        ),
        "the promoted standby took the writes": port == cluster.nodes[1].port,
        "every acknowledged turn is stored": not (acknowledged - stored),
        "no turn is stored twice": max(inputs.values(), default=0) == 1 and stored == acknowledged,
        "every turn has its snippets and its ledger row": snippets == len(NAMES) * stored.total()
        and ledger == stored.total(),
    }
    figures = {
        "writers": str(len(writers)),
        "turns acknowledged": str(acknowledged.total()),
        "turns stored": str(stored.total()),
        "acknowledged after the kill": str(sum(t > killed_at for t in times)),
        "time without writes (longest stretch with no write acknowledged)": f"{gap:.2f} s",
        "that stretch began after the kill by": f"{gap_start - killed_at:+.2f} s",
        "deliveries retried by the writers, by error": (
            ", ".join(f"{k} {v}" for k, v in retried.items()) or "-"
        ),
        "units of work run again inside the library": str(RETRIES.count),
    }
    failures = [f"writer {w.number}: {w.failure!r}" for w in writers if w.failure is not None]
    if failures:
        figures["writer failures"] = "; ".join(failures)
    return Outcome(checks, figures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--writers", type=int, default=4, help="Writer threads.")
    parser.add_argument(
        "--before", type=int, default=150, help="Turns acknowledged before the kill."
    )
    parser.add_argument(
        "--after", type=float, default=1.0, help="Seconds of writes after every writer recovered."
    )
    args = parser.parse_args(argv)
    # A CI time limit or ^C still tears the formation down (formation()'s finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    library = logging.getLogger("zerda_store.unit_of_work")
    library.addHandler(RETRIES)
    library.propagate = False
    try:
        outcome = run(args.writers, args.before, args.after)
    except ClusterError as exc:
        print(f"failover harness: {exc}", file=sys.stderr)
        return 2
    for name, value in outcome.figures.items():
        print(f"{name}: {value}")
    for name, passed in outcome.checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
    passed = sum(outcome.checks.values())
    print(f"failover: {passed} passed, {len(outcome.checks) - passed} failed")
    return 0 if passed == len(outcome.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
