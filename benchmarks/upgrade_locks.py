"""How long `db upgrade` keeps other connections waiting: a Postgres database filled as the
released version (revision 0004) left it, upgraded to head while probes read snippets,
look an entity up by its key, and insert turns every 0.5 s from other connections
(``lock_timeout`` 2 s, as an application would set).

    python -m benchmarks.upgrade_locks                  # 200,000 turns (the issue's size)
    python -m benchmarks.upgrade_locks --turns 20000    # a quicker look

Prints the upgrade's time (and each revision's, and how often a step gave way to another
transaction's lock and tried again), the time of `db contract` after it, then per probe the longest wait and the time spent waiting
longer than 1 s (a probe that hit its lock_timeout counts 2 s and a failure). Makes one
database ``zerda_bench_<random>`` and drops it.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

import sqlalchemy as sa

from benchmarks.databases import POSTGRES_ADMIN_URL
from zerda_store import Store, migrate

RELEASED_REVISION = "0004"
TURNS_PER_SESSION = 1000
ENTITIES_PER_SESSION = 100
SNIPPETS_PER_TURN = 3
PROBE_EVERY = 0.5
LOCK_TIMEOUT_MS = 2000

# What the released version wrote, in bulk: sessions of 1,000 turns naming three of their
# 100 entities each ("Müller" and "Muller" among them: one key under fold-v2). Ids
# follow the insertion order of a new database.
FILL = [
    """INSERT INTO turns (session_id, input_text, output_text, entity_names, created_at)
       SELECT 's' || ((n - 1) / {per_session}), 'text of turn ' || n, 'noted', '[]',
              1700000000 + n
       FROM generate_series(1, {turns}) AS n ORDER BY n""",
    """INSERT INTO entities (session_id, name_key, name, entity_type, first_seen, last_seen,
                             first_turn_id, first_position)
       SELECT 's' || s, lower(name), name, 'unknown', 1700000000, 1700000000,
              s * {per_session} + e + 1, 0
       FROM generate_series(0, {sessions} - 1) AS s,
            generate_series(0, {entities} - 1) AS e,
            LATERAL (SELECT CASE e WHEN 0 THEN 'Müller' WHEN 1 THEN 'Muller'
                                   ELSE 'Person ' || e END AS name) AS named
       ORDER BY s, e""",
    """INSERT INTO contexts (session_id, entity_id, turn_id, turn_seq, text)
       SELECT t.session_id,
              ((t.id - 1) / {per_session}) * {entities} + (t.id * 7 + k * 31) %% {entities} + 1,
              t.id, t.id, 'snippet of turn ' || t.id
       FROM turns t, generate_series(0, {snippets} - 1) AS k ORDER BY t.id, k""",
    "ANALYZE",
]


@dataclass
class Probe:
    """One connection doing one statement every 0.5 s; the waits it saw."""

    name: str
    statement: str
    waits: list[float] = field(default_factory=list)
    failures: int = 0

    def run(self, engine: sa.Engine, stop: threading.Event) -> None:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
            connection.commit()
            while not stop.is_set():
                started = time.monotonic()
                try:
                    connection.exec_driver_sql(self.statement)
                    connection.commit()
                except sa.exc.DBAPIError:
                    connection.rollback()
                    self.failures += 1
                self.waits.append(time.monotonic() - started)
                stop.wait(PROBE_EVERY)

    def summary(self) -> dict[str, object]:
        return {
            "probe": self.name,
            "longest_s": round(max(self.waits, default=0.0), 2),
            "waiting_over_1s_s": round(sum(w for w in self.waits if w > 1.0), 1),
            "failed": self.failures,
            "statements": len(self.waits),
        }


PROBES = (
    ("read", "SELECT text FROM contexts WHERE entity_id = 5 ORDER BY turn_seq DESC LIMIT 3"),
    ("entity", "SELECT id, name FROM entities WHERE session_id = 's5' AND name_key = 'person 7'"),
    ("write", "INSERT INTO turns (session_id, input_text, output_text, entity_names, "
              "created_at) VALUES ('probe', 'x', 'y', '[]', 1700000000)"),
)  # fmt: skip


class RevisionClock(logging.Handler):
    """When each revision began (Alembic logs "Running upgrade A -> B"), and how often a
    step gave way to another transaction's lock and tried again."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.started = time.monotonic()
        self.begun: list[tuple[str, float]] = []
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Running upgrade"):
            revision = message.split(" -> ")[1].split(",")[0]
            self.begun.append((revision, time.monotonic() - self.started))
        elif "trying again" in message:
            self.retries += 1

    def __enter__(self) -> RevisionClock:
        for name in ("alembic.runtime.migration", "zerda_store.migrate"):
            logger = logging.getLogger(name)
            logger.addHandler(self)
            logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("alembic.runtime.migration", "zerda_store.migrate"):
            logging.getLogger(name).removeHandler(self)

    def durations(self, total: float) -> dict[str, float]:
        ends = [at for _, at in self.begun[1:]] + [total]
        return {rev: round(end - at, 1) for (rev, at), end in zip(self.begun, ends, strict=True)}


def measure(url: str, turns: int) -> dict[str, object]:
    sessions = max(1, turns // TURNS_PER_SESSION)
    values = {"turns": turns, "sessions": sessions, "per_session": TURNS_PER_SESSION,
              "entities": ENTITIES_PER_SESSION, "snippets": SNIPPETS_PER_TURN}  # fmt: skip
    with Store(url) as store:
        migrate.upgrade(store, RELEASED_REVISION)
        started = time.monotonic()
        with store.connect() as connection, connection.begin():
            for statement in FILL:
                connection.exec_driver_sql(statement.format(**values))
        filled = time.monotonic() - started
        probes = [Probe(name, statement) for name, statement in PROBES]
        engine = sa.create_engine(url)
        stop = threading.Event()
        threads = [threading.Thread(target=p.run, args=(engine, stop)) for p in probes]
        for thread in threads:
            thread.start()
        time.sleep(2 * PROBE_EVERY)
        started = time.monotonic()
        with RevisionClock() as clock:
            report = migrate.upgrade(store)
        upgraded = time.monotonic() - started
        started = time.monotonic()
        migrate.contract(store)
        contracted = time.monotonic() - started
        time.sleep(2 * PROBE_EVERY)
        stop.set()
        for thread in threads:
            thread.join()
        engine.dispose()
    return {
        "turns": turns,
        "fill_s": round(filled, 1),
        "upgrade_s": round(upgraded, 1),
        "revisions_s": clock.durations(upgraded),
        "lock_retries": clock.retries,
        "contract_s": round(contracted, 2),
        "merges": sum(len(entry["merges"]) for entry in report),
        "probes": [probe.summary() for probe in probes],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200_000)
    arguments = parser.parse_args()
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"zerda_bench_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(POSTGRES_ADMIN_URL).set(database=name)
    try:
        result = measure(url.render_as_string(hide_password=False), arguments.turns)
        print(json.dumps(result, indent=2))
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


if __name__ == "__main__":
    main()
