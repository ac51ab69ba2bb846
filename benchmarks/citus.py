"""Save and recall per turn through a Citus coordinator against the plain Postgres server, in
one run (the same turns, the same scripted model, interleaved rounds).

    python -m benchmarks.citus [--coordinator URL] [--turns N] [--rounds R] [--sessions S]

The coordinator comes from ``--coordinator`` or ``ZERDA_BENCH_CITUS_URL`` (an admin URL, as
``scripts/citus start`` prints it); without either, the run starts a cluster with
``scripts/citus start`` and stops it at the end. The plain server is
``ZERDA_BENCH_POSTGRES_URL`` (default: the local server as user postgres). Each side gets a
new database at head; the Citus one is made on every node and distributed with
``db distribute``. Both are dropped at the end. The ratio is Citus's median over the plain
server's (target: at most 1.3×). ``--sessions S`` spreads the turns over S customers'
sessions as a service has them (a memory per session on one shared store, turn ``i`` in
session ``i % S``), so that they land on several shards.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import sqlalchemy as sa

from zerda_store import ConversationEntityMemory, Store, migrate

from .databases import POSTGRES_ADMIN_URL, Database
from .turns import SESSION, ZerdaTurns, _blocks, _timed_block
from .workload import Query, Turn, interleaved, make_queries, make_turns

TARGET = 1.3
WARM_UP = 40
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "citus"


def _admin(url: sa.URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def _run(url: sa.URL, *statements: str) -> None:
    engine = _admin(url)
    try:
        with engine.connect() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


@contextmanager
def plain_database(admin_url: str) -> Iterator[Database]:
    """A new database at head on the plain Postgres server."""
    url = sa.make_url(admin_url)
    name = f"zerda_bench_{uuid.uuid4().hex[:12]}"
    _run(url, f'CREATE DATABASE "{name}"')
    try:
        yield _at_head(url.set(database=name))
    finally:
        _run(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def citus_database(coordinator_url: str) -> Iterator[Database]:
    """A new database on every node of the cluster, at head, distributed by session."""
    url = sa.make_url(coordinator_url)
    engine = _admin(url)
    with engine.connect() as connection:
        nodes = connection.execute(
            sa.text("SELECT nodename, nodeport FROM pg_dist_node ORDER BY groupid")
        ).all()
    engine.dispose()
    (host, port), *workers = nodes
    name = f"zerda_bench_{uuid.uuid4().hex[:12]}"
    node_urls = [url.set(host=h, port=int(p)) for h, p in nodes]
    try:
        for node in node_urls:
            _run(node, f'CREATE DATABASE "{name}"')
            _run(node.set(database=name), "CREATE EXTENSION citus")
        calls = [f"SELECT citus_set_coordinator_host('{host}', {port})"]
        calls += [f"SELECT citus_add_node('{h}', {p})" for h, p in workers]
        _run(url.set(database=name), *calls)
        database = _at_head(url.set(database=name))
        with Store(database.url) as store:
            migrate.distribute(store)
        yield database
    finally:
        for node in node_urls:
            _run(node, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _at_head(url: sa.URL) -> Database:
    rendered = url.render_as_string(hide_password=False)
    with Store(rendered) as store:
        migrate.upgrade(store)
    address = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return Database("postgres", rendered, address)


@contextmanager
def coordinator(url: str | None) -> Iterator[str]:
    """The coordinator's URL: the one given, or a cluster started for the run."""
    if url:
        yield url
        return
    env = {**os.environ, "ZERDA_CITUS_STATE": f"/tmp/zerda-citus-bench-{os.getpid()}.state"}
    started = subprocess.run(
        [str(SCRIPT), "start"], env=env, check=True, capture_output=True, text=True
    )
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False)


class SessionTurns(ZerdaTurns):
    """Turns spread over ``sessions`` customers' sessions, a memory each on one store."""

    def __init__(self, database: Database, sessions: int) -> None:
        super().__init__(database)
        self.memories = [self.memory] + [
            ConversationEntityMemory(self.llm, store=self.store, session_id=f"{SESSION}-{n}")
            for n in range(1, sessions)
        ]
        self.turn = 0

    def save(self, turn: Turn) -> None:
        self.memory = self.memories[self.turn % len(self.memories)]
        self.turn += 1
        super().save(turn)

    def load(self, query: Query) -> str:
        self.memory = self.memories[(self.turn - 1) % len(self.memories)]
        self.turn += 1
        return super().load(query)

    def close(self) -> None:
        for memory in self.memories[1:]:
            memory.close()
        super().close()


def compare(
    citus: Database,
    plain: Database,
    turns: int,
    rounds: int,
    sessions: int = 1,
    workers: Database | None = None,
) -> dict[str, float]:
    """Median seconds per save and per recall on each side, and the ratios to the plain
    server's. ``workers``: a second Citus database, used by a store that routes its calls
    straight to the workers (``route_to_workers=True``)."""
    sides = {"citus": SessionTurns(citus, sessions), "plain": SessionTurns(plain, sessions)}
    if workers is not None:
        sides["workers"] = SessionTurns(workers, sessions)
    saved = make_turns(WARM_UP + turns)
    queries = make_queries(WARM_UP + turns)
    try:
        for side in sides.values():
            for turn, query in zip(saved[:WARM_UP], queries[:WARM_UP], strict=True):
                side.save(turn)
                side.load(query)
        save_blocks = _blocks(saved[WARM_UP:], rounds)
        load_blocks = _blocks(queries[WARM_UP:], rounds)
        saves = interleaved(
            {name: _saver(side, save_blocks) for name, side in sides.items()}, rounds
        )
        loads = interleaved(
            {name: _loader(side, load_blocks) for name, side in sides.items()}, rounds
        )
        same = all(len({side.load(q) for side in sides.values()}) == 1 for q in queries[:50])
    finally:
        for side in sides.values():
            side.close()
    if not same:
        raise SystemExit("the databases recalled different memories")
    figures = {}
    for name in sides:
        for what, timed in (("save", saves), ("load", loads)):
            figures[f"{name}_{what}"] = timed[name].median
            figures[f"{name}_{what}_ratio"] = timed[name].median / timed["plain"].median
    return figures


def _saver(side: ZerdaTurns, blocks: list[list[Turn]]) -> Callable[[int], float]:
    return lambda r: _timed_block(side.save, blocks[r])


def _loader(side: ZerdaTurns, blocks: list[list[Query]]) -> Callable[[int], float]:
    return lambda r: _timed_block(side.load, blocks[r])


# One statement that reaches a shard, and one that does not (the coordinator alone): the
# floor under every statement of a save or a recall through the coordinator.
ROUTED = "SELECT id FROM turns WHERE session_id = %s AND id = 1"
LOCAL = "SELECT 1"


def statement_floor(database: Database, statement: str, count: int = 1500) -> float:
    """Median seconds of one prepared statement, run alone on one connection."""
    import psycopg

    values = ("customer-1",) if "%s" in statement else None
    with psycopg.connect(database.address, autocommit=True) as connection:
        times = []
        for _ in range(100 + count):
            started = time.perf_counter()
            connection.execute(statement, values, prepare=True).fetchall()
            times.append(time.perf_counter() - started)
    return statistics.median(times[100:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default=os.environ.get("ZERDA_BENCH_CITUS_URL"))
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument(
        "--no-workers",
        action="store_true",
        help="leave out the store that routes its calls straight to the workers",
    )
    args = parser.parse_args(argv)
    with (
        coordinator(args.coordinator) as url,
        citus_database(url) as citus,
        plain_database(POSTGRES_ADMIN_URL) as plain,
        nullcontext(None) if args.no_workers else citus_database(url) as second,
    ):
        workers = None
        if second is not None:
            routed = sa.make_url(second.url).update_query_dict({"route_to_workers": "true"})
            workers = dataclasses.replace(second, url=routed.render_as_string(hide_password=False))
        figures = compare(citus, plain, args.turns, args.rounds, args.sessions, workers)
        floors = {
            what: (statement_floor(citus, statement), statement_floor(plain, statement))
            for what, statement in (("routed to a shard", ROUTED), ("on the coordinator", LOCAL))
        }
    load = os.getloadavg()[0]
    print(
        f"{args.sessions} session(s) from {SESSION!r}, {args.turns} turns in {args.rounds} "
        f"rounds, load {load:.1f}"
    )
    for what in ("save", "load"):
        for side, label in (("citus", "through the coordinator"), ("workers", "to the workers")):
            if f"{side}_{what}" not in figures:
                continue
            ratio = figures[f"{side}_{what}_ratio"]
            verdict = "ok" if ratio <= TARGET else f"over the {TARGET}× target"
            print(
                f"{what} per turn, {label}: citus {figures[f'{side}_{what}'] * 1e3:.2f} ms, "
                f"plain {figures[f'plain_{what}'] * 1e3:.2f} ms, ratio {ratio:.2f}× ({verdict})"
            )
    for what, (on_citus, on_plain) in floors.items():
        print(f"one statement {what}: citus {on_citus * 1e6:.0f} µs, plain {on_plain * 1e6:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
