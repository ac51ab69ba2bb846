"""Where a turn's time goes: zerda_store's save or load under cProfile, summed by layer.

    python -m benchmarks.profile_turns [--backend sqlite|postgres] [--op save|load]
                                       [--turns N] [--durable] [--top N]

Each function's own time (cProfile ``tottime``) is charged to one layer: the driver (C
calls into sqlite3 or psycopg, and the waits inside them), SQLAlchemy's statement
compilation and caching, its execution and result objects, its pool and events, and
zerda_store's own modules. cProfile slows pure-Python code more than C calls, so the
shares of Python layers are upper bounds; the statement counts are exact.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa

from .databases import Databases
from .turns import ZerdaTurns
from .workload import make_queries, make_turns

LAYERS = (
    ("sqlalchemy/sql/", "SQLAlchemy: building statements, cache keys, compiling"),
    ("sqlalchemy/engine/", "SQLAlchemy: execution, cursor results"),
    ("sqlalchemy/pool/", "SQLAlchemy: connection pool (checkout, pre-ping, reset)"),
    ("sqlalchemy/event/", "SQLAlchemy: event dispatch"),
    ("sqlalchemy/", "SQLAlchemy: other"),
    ("psycopg", "driver: psycopg (waits for the server: round trips; its Python)"),
    ("zerda_store/turns/", "zerda_store: turns (repository, statements)"),
    ("zerda_store/db/", "zerda_store: db (connect, transactions, pragmas)"),
    ("zerda_store/memory/", "zerda_store: memory (validation, blocks)"),
    ("zerda_store/extraction.py", "zerda_store: extraction service"),
    ("zerda_store/model/", "zerda_store: names and records"),
    ("benchmarks/", "benchmark driver and scripted model"),
)


def layer_of(filename: str, function: str) -> str:
    if filename == "~":
        if "sqlite3" in function or "psycopg" in function or "pq" in function:
            return "driver: C calls (statements, commits, fsync waits, network)"
        return "Python built-ins"
    for fragment, layer in LAYERS:
        if fragment in filename:
            return layer
    return "standard library and other"


def by_layer(stats: pstats.Stats) -> list[tuple[str, float]]:
    totals: dict[str, float] = {}
    for (filename, _line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        layer = layer_of(filename, function)
        totals[layer] = totals.get(layer, 0.0) + row[2]
    return sorted(totals.items(), key=lambda item: -item[1])


def count_statements(engine: sa.Engine) -> Counter[str]:
    """Counts what the engine's dialect hands to the driver, by the statement's first word
    (both SQLAlchemy's execution and zerda_store's compiled statements call ``do_execute``)."""
    counts: Counter[str] = Counter()
    execute = engine.dialect.do_execute

    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        counts[statement.split(None, 1)[0].upper()] += 1
        execute(cursor, statement, parameters, context)

    engine.dialect.do_execute = do_execute  # type: ignore[method-assign]
    return counts


def for_each(work: Callable[[Any], object], items: Iterable[Any]) -> None:
    for item in items:
        work(item)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--op", choices=["save", "load"], default="save")
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--durable", action="store_true", help="keep the fsync on commit")
    parser.add_argument("--top", type=int, default=15, help="functions to list")
    args = parser.parse_args(argv)
    with Databases(args.backend) as dbs:
        zerda = ZerdaTurns(dbs.get("zerda"), durable=args.durable)
        turns = make_turns(2 * args.turns)
        queries = make_queries(args.turns)
        for turn in turns[: args.turns]:
            zerda.save(turn)
        counts = count_statements(zerda.store.engine)
        profile = cProfile.Profile()
        if args.op == "save":
            profile.runcall(lambda: for_each(zerda.save, turns[args.turns :]))
        else:
            profile.runcall(lambda: for_each(zerda.load, queries))
        zerda.close()
    stats = pstats.Stats(profile)
    total = sum(seconds for _, seconds in by_layer(stats))
    print(f"zerda_store {args.op}, {args.backend}, {args.turns} calls: ", end="")
    print(f"{total / args.turns * 1e6:,.0f} µs a call under cProfile")
    print("statements a call: " + ", ".join(f"{k} {v / args.turns:g}" for k, v in counts.items()))
    print("\n| layer | share | µs a call |\n|---|---|---|")
    for layer, seconds in by_layer(stats):
        print(f"| {layer} | {seconds / total:.0%} | {seconds / args.turns * 1e6:,.1f} |")
    print()
    stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
