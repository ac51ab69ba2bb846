"""Section (f): several processes saving turns at once, each for its own customer.

Every process opens its own connection, warms up, reports ready and waits for one start
signal; throughput is all turns over the time from the signal to the last process done.
zerda_store and the floor take turns (interleaved rounds), each on its own database, and
the row counts are checked afterwards.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from .databases import Database, Databases
from .floor import open_floor
from .report import Figure, ratio_figure
from .turns import ZerdaTurns
from .workload import ENTITIES_PER_TURN, Samples, interleaved, make_turns

WARM_UP = 5


def _writer(
    who: str,
    database: Database,
    session_id: str,
    seed: int,
    count: int,
    ready: Any,
    start: Any,
    done: Any,
) -> None:
    turns = make_turns(WARM_UP + count, seed=seed)
    if who == "zerda":
        zerda = ZerdaTurns(database, session_id)
        save, close = zerda.save, zerda.close
    else:
        floor = open_floor(database)

        def save(turn: Any) -> None:
            floor.save(session_id, turn)

        close = floor.close
    try:
        for turn in turns[:WARM_UP]:
            save(turn)
        ready.put(True)
        start.wait()
        for turn in turns[WARM_UP:]:
            save(turn)
        done.put(time.monotonic())
    finally:
        close()


def _run(who: str, database: Database, processes: int, count: int, round_number: int) -> float:
    # A fork server that imported this module once: children start in milliseconds and
    # inherit no database connection from this process.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    ready, done, start = context.Queue(), context.Queue(), context.Event()
    workers = [
        context.Process(
            target=_writer,
            args=(who, database, f"writer-{round_number}-{p}", 100 + p, count, ready, start, done),
        )
        for p in range(processes)
    ]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=120)
    started = time.monotonic()
    start.set()
    finished: float = max(done.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise RuntimeError(f"a {who} writer failed with exit code {worker.exitcode}")
    return processes * count / (finished - started)


def _counts(database: Database, prefix: str) -> tuple[int, int]:
    """Turns and snippets of the writers' sessions."""
    engine = sa.create_engine(database.url)
    try:
        with engine.connect() as connection:
            counts = [
                connection.execute(
                    sa.text(f"SELECT count(*) FROM {table} WHERE session_id LIKE :prefix"),
                    {"prefix": prefix + "%"},
                ).scalar_one()
                for table in ("turns", "contexts")
            ]
    finally:
        engine.dispose()
    return int(counts[0]), int(counts[1])


def concurrent_writers(dbs: Databases, processes: int, count: int, rounds: int) -> list[Figure]:
    databases = {"zerda": dbs.get("zerda"), "floor": dbs.get("floor")}

    def round_of(who: str) -> Callable[[int], float]:
        return lambda r: _run(who, databases[who], processes, count, r)

    samples: dict[str, Samples] = interleaved({who: round_of(who) for who in databases}, rounds)
    expected = rounds * processes * (WARM_UP + count)
    exact = all(
        _counts(database, "writer-") == (expected, expected * ENTITIES_PER_TURN)
        for database in databases.values()
    )
    figure = ratio_figure(
        "f",
        dbs.backend,
        f"{processes} processes saving turns at once (own session each, {count} turns each)",
        samples["floor"],
        samples["zerda"],
        "floor",
        unit="turns/s",
    )
    # Shown as zerda's turns/s; the ratio stays "time per turn, zerda over floor".
    figure.value, figure.reference = samples["zerda"].median, samples["floor"].median
    figure.best, figure.reference_best = (
        max(samples["zerda"].values),
        max(samples["floor"].values),
    )
    figure.inverse = True
    figure.note = "row counts exact" if exact else "ROW COUNTS WRONG"
    return [figure]
