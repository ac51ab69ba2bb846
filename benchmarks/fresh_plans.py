"""Postgres before its statistics: what a turn costs on a freshly filled database that was
never analysed (before autovacuum or an ``ANALYZE`` got to it), and how the recall grows
with the session there.

    python -m benchmarks.fresh_plans [--fill 20000] [--turns 1600] [--rounds 8] [--quick]

(a) zerda_store's ``save_context`` and ``load_memory_variables`` against the floor
(``floor.py``), each in its own schema filled with the same ``--fill`` turns of the
workload (300 names, three a turn) and measured in interleaved rounds, as
``bench_turns`` (a) and (b) do; the tables are never analysed (autovacuum is off on
them, and zerda_store's own analysis after a bulk save is switched off: the fill stands
for many small saves that autovacuum has not caught up with).
(b) The recall of a cold and a hot entity (``scale.py``'s stores: ~1,000 and ~200,000
snippets in one session, 5,000 of them the hot entity's), p50 per call, first with the
tables never analysed, then after ``ANALYZE``: the large store against the small one
(target ≤ 1.2×), and the large store before its statistics against after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from zerda_store.db import statistics as table_statistics
from zerda_store.db.schema import metadata

from .databases import Database, Databases, postgres_available
from .floor import open_floor
from .report import Figure, Machine, markdown, ratio_figure
from .scale import COLD, GROWTH_TARGET, HOT, SESSION, fill
from .turns import LOAD_TARGETS, SAVE_TARGETS, ZerdaTurns, _blocks, _timed_block
from .turns import SESSION as TURNS_SESSION
from .workload import Query, Samples, each_call, interleaved, make_queries, make_turns

FILL_CHUNK = 2_000


def _no_autovacuum(database: Database) -> None:
    """Autovacuum off on the database's tables: nothing analyses them behind the run."""
    engine = sa.create_engine(database.url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            for table in metadata.sorted_tables:
                connection.exec_driver_sql(
                    f"ALTER TABLE {table.name} SET (autovacuum_enabled = false)"
                )
    finally:
        engine.dispose()


def _analysed(database: Database) -> list[str]:
    """The database's tables that were ever analysed (the schema's, by search_path)."""
    engine = sa.create_engine(database.url)
    try:
        with engine.connect() as connection:
            rows = connection.exec_driver_sql(
                "SELECT relname FROM pg_stat_user_tables WHERE schemaname = current_schema()"
                " AND coalesce(last_analyze, last_autoanalyze) IS NOT NULL"
            )
            return [row.relname for row in rows]
    finally:
        engine.dispose()


def _analyze(database: Database) -> None:
    engine = sa.create_engine(database.url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()


def floor_on_fresh_tables(
    dbs: Databases, fill_turns: int, turn_count: int, rounds: int
) -> list[Figure]:
    """(a): per-turn save and load against the floor, on tables never analysed."""
    databases = {"zerda": dbs.new("fresh_zerda"), "floor": dbs.new("fresh_floor")}
    for database in databases.values():
        _no_autovacuum(database)
    zerda = ZerdaTurns(databases["zerda"])
    floor = open_floor(databases["floor"])
    filled = make_turns(fill_turns, seed=5)
    turns = make_turns(turn_count, seed=6)
    queries = make_queries(turn_count, seed=7)
    try:
        for start in range(0, fill_turns, FILL_CHUNK):
            zerda.save_many(filled[start : start + FILL_CHUNK])
            floor.save_many(TURNS_SESSION, filled[start : start + FILL_CHUNK])
        save_blocks = _blocks(turns, rounds)
        load_blocks = _blocks(queries, rounds)
        saves = interleaved(
            {
                "zerda": lambda r: _timed_block(zerda.save, save_blocks[r]),
                "floor": lambda r: _timed_block(
                    lambda t: floor.save(TURNS_SESSION, t), save_blocks[r]
                ),
            },
            rounds,
        )
        loads = interleaved(
            {
                "zerda": lambda r: _timed_block(zerda.load, load_blocks[r]),
                "floor": lambda r: _timed_block(
                    lambda q: floor.load(TURNS_SESSION, q.names), load_blocks[r]
                ),
            },
            rounds,
        )
        same = all(zerda.load(q) == floor.load(TURNS_SESSION, q.names) for q in queries[:50])
    finally:
        zerda.close()
        floor.close()
    analysed = sorted({*_analysed(databases["zerda"]), *_analysed(databases["floor"])})
    note = f"{fill_turns:,} turns filled, tables analysed: {', '.join(analysed) or 'none'}"
    if not same:
        note += "; LOAD OUTPUTS DIFFER"
    return [
        ratio_figure(
            "a",
            "postgres",
            "save_context per turn, never-analysed tables",
            saves["zerda"],
            saves["floor"],
            "floor",
            limit=SAVE_TARGETS["postgres"],
            note=note,
        ),
        ratio_figure(
            "b",
            "postgres",
            "load_memory_variables per turn (3 entities), never-analysed tables",
            loads["zerda"],
            loads["floor"],
            "floor",
            limit=LOAD_TARGETS["postgres"],
            note=note,
        ),
    ]


def _recall_p50s(
    stores: dict[str, Database], calls: int, rounds: int
) -> tuple[dict[str, Samples], Callable[[], None]]:
    """Interleaved p50s of recalling the cold and the hot entity in each store; and how
    to close the memories."""
    memories = {label: ZerdaTurns(database, SESSION) for label, database in stores.items()}
    queries = {name: Query(f"What happened with {name}?", (name,)) for name in (COLD, HOT)}
    variants: dict[str, Callable[[int], float]] = {}
    for label, memory in memories.items():
        for name, query in queries.items():

            def work(_: int, memory: ZerdaTurns = memory, query: Query = query) -> Any:
                return memory.load(query)

            def p50(_round: int, work: Callable[[int], Any] = work) -> float:
                return statistics.median(each_call(work, calls))

            each_call(work, 20)
            variants[f"{label}|{name}"] = p50

    def close() -> None:
        for memory in memories.values():
            memory.close()

    return interleaved(variants, rounds), close


def recall_before_statistics(
    dbs: Databases, small: int, large: int, calls: int, rounds: int
) -> list[Figure]:
    """(b): the recall at ~``large`` against ~``small`` snippets, never analysed, then
    analysed."""
    stores = {"small": dbs.new("fresh_small"), "large": dbs.new("fresh_large")}
    sizes = {}
    for (label, database), snippets in zip(stores.items(), (small, large), strict=True):
        _no_autovacuum(database)
        sizes[label] = fill(database, snippets, analyze=False)
    stale, close = _recall_p50s(stores, calls, rounds)
    close()
    never = not any(_analysed(database) for database in stores.values())
    for database in stores.values():
        _analyze(database)
    fresh, close = _recall_p50s(stores, calls, rounds)
    close()
    figures = []
    counts = f"{sizes['large']['snippets']:,} vs {sizes['small']['snippets']:,} snippets"
    for name, kind in ((COLD, "cold entity (1 snippet)"), (HOT, "hot entity")):
        hot = f", {sizes['small']['hot']:,} → {sizes['large']['hot']:,} its" if name == HOT else ""
        for when, samples in (("never analysed", stale), ("analysed", fresh)):
            figures.append(
                ratio_figure(
                    "d",
                    "postgres",
                    f"recall p50, {kind}, {when}: {counts}{hot}",
                    samples[f"large|{name}"],
                    samples[f"small|{name}"],
                    f"{sizes['small']['snippets']:,}",
                    limit=GROWTH_TARGET,
                    note="" if never or when == "analysed" else "ANALYSED DURING THE RUN",
                )
            )
        figures.append(
            ratio_figure(
                "d",
                "postgres",
                f"recall p50, {kind}, {sizes['large']['snippets']:,} snippets: never analysed"
                " vs analysed",
                stale[f"large|{name}"],
                fresh[f"large|{name}"],
                "analysed",
                limit=GROWTH_TARGET,
            )
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fill", type=int, default=20_000, help="turns filled before (a)")
    parser.add_argument("--turns", type=int, default=1_600, help="turns measured in (a)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300, help="recalls per round in (b)")
    parser.add_argument("--quick", action="store_true", help="a smaller run")
    parser.add_argument("--sections", default="ab")
    args = parser.parse_args(argv)
    reason = postgres_available()
    if reason:
        parser.error(f"no Postgres server: {reason}")
    if args.quick:
        args.fill, args.turns, args.rounds, args.calls = 2_000, 400, 4, 100
    # The fill stands for many small saves: no analysis after a bulk one.
    table_statistics.BULK_ROWS = sys.maxsize
    figures: list[Figure] = []
    with Databases("postgres") as dbs:
        machine = Machine().collect(None, dbs.server_version())
        if "a" in args.sections:
            figures += floor_on_fresh_tables(dbs, args.fill, args.turns, args.rounds)
        if "b" in args.sections:
            figures += recall_before_statistics(dbs, 1_000, 200_000, args.calls, args.rounds)
    machine["load average at the end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(markdown(figures, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
