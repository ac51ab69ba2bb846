"""Per-turn cost of zerda_store against a raw-driver floor, at scale, and against LangChain.

    python -m benchmarks.bench_turns [--backend sqlite|postgres|both] [--turns N] [--quick]
                                     [--json] [--sections abcdefgh] [--folder DIR]

Sections: (a) save_context and (b) load_memory_variables per turn against the floor;
(c) save_contexts against a save_context loop; (d) recall latency of a cold and a hot
entity in a ~1k and a ~200k snippet store; (e) memory a process gains by opening the big
store against the small one; (f) several processes writing at once; (g) a whole turn
against LangChain's ConversationEntityMemory (SQLite only); (h) the CPU time of a whole turn
through a new memory per request against one memory kept per customer, on one shared store.
Variants run in interleaved rounds so that a noisy neighbour weighs on all of them alike; the
table shows medians over rounds and the best round.

Postgres comes from ``ZERDA_BENCH_POSTGRES_URL`` (an admin URL; default: the local server as
user postgres); every database the run makes (``zerda_bench_*``) is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass

from .databases import Databases, postgres_available
from .langchain_turns import langchain_missing, whole_turns
from .per_request import per_request
from .report import Figure, Machine, as_json, markdown
from .scale import recall_growth, rss_growth
from .turns import bulk_import, save_and_load, save_without_commit_wait
from .writers import concurrent_writers

ALL_SECTIONS = "abcdefgh"
logger = logging.getLogger("benchmarks")


@dataclass(frozen=True)
class Plan:
    """How much work each section does; ``--quick`` shrinks all of it."""

    turns: int
    rounds: int
    bulk_turns: int
    bulk_rounds: int
    small_store: int
    large_store: int
    recall_calls: int
    recall_rounds: int
    rss_rounds: int
    writer_processes: int
    writer_turns: int
    writer_rounds: int
    langchain_turns: int
    request_turns: int
    request_rounds: int

    @classmethod
    def make(cls, quick: bool, turns: int | None) -> Plan:
        if quick:
            return cls(
                turns=turns or 240,
                rounds=6,
                bulk_turns=150,
                bulk_rounds=3,
                small_store=1_000,
                large_store=200_000,
                recall_calls=60,
                recall_rounds=4,
                rss_rounds=1,
                writer_processes=4,
                writer_turns=40,
                writer_rounds=1,
                langchain_turns=30,
                request_turns=240,
                request_rounds=6,
            )
        return cls(
            turns=turns or 1_400,
            rounds=14,
            bulk_turns=1_000,
            bulk_rounds=5,
            small_store=1_000,
            large_store=200_000,
            recall_calls=150,
            recall_rounds=9,
            rss_rounds=3,
            writer_processes=4,
            writer_turns=200,
            writer_rounds=2,
            langchain_turns=300,
            request_turns=1_400,
            request_rounds=14,
        )


class _Stopwatch:
    """Logs how long each section took (shown with ``--verbose``)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def __call__(self, label: str) -> _Lap:
        return _Lap(f"{self.backend} {label}")


class _Lap:
    def __init__(self, label: str) -> None:
        self.label = label

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *_: object) -> None:
        logger.info("%s: %.1f s", self.label, time.perf_counter() - self.started)


def run_backend(backend: str, plan: Plan, sections: str, folder: str | None) -> list[Figure]:
    figures: list[Figure] = []
    lap = _Stopwatch(backend)
    with Databases(backend, folder) as dbs:
        if "a" in sections or "b" in sections:
            with lap("(a) save and (b) load"):
                figures += save_and_load(dbs, plan.turns, plan.rounds)
            with lap("(a) save without fsync wait"):
                figures += save_without_commit_wait(dbs, plan.turns, plan.rounds)
        if "c" in sections:
            with lap("(c) save_contexts"):
                figures += bulk_import(dbs, plan.bulk_turns, plan.bulk_rounds)
        if "d" in sections or "e" in sections:
            with lap("(d) recall against table size"):
                growth, stores = recall_growth(
                    dbs, plan.small_store, plan.large_store, plan.recall_calls, plan.recall_rounds
                )
            if "d" in sections:
                figures += growth
            if "e" in sections:
                with lap("(e) RSS"):
                    figures += rss_growth(backend, stores, plan.rss_rounds)
        if "f" in sections:
            with lap("(f) concurrent writers"):
                figures += concurrent_writers(
                    dbs, plan.writer_processes, plan.writer_turns, plan.writer_rounds
                )
        if "g" in sections and backend == "sqlite":
            missing = langchain_missing()
            if missing:
                logger.warning("section (g) skipped: %s", missing)
            else:
                with lap("(g) LangChain"):
                    figures += whole_turns(dbs, plan.langchain_turns, plan.bulk_rounds)
        if "h" in sections:
            with lap("(h) one memory per request"):
                figures += per_request(dbs, plan.request_turns, plan.request_rounds)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--turns", type=int, help="turns per variant in (a) and (b)")
    parser.add_argument("--quick", action="store_true", help="a smaller run (~20 s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    parser.add_argument("--sections", default=ALL_SECTIONS, help="a subset of 'abcdefgh'")
    parser.add_argument("--folder", help="where the SQLite files go (default: the temp folder)")
    parser.add_argument("--verbose", action="store_true", help="log each section's duration")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO if args.verbose else logging.WARNING)
    plan = Plan.make(args.quick, args.turns)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    postgres_version = None
    if "postgres" in backends:
        reason = postgres_available()
        if reason:
            if args.backend == "postgres":
                parser.error(f"no Postgres server: {reason}")
            logger.warning("Postgres skipped: %s", reason)
            backends.remove("postgres")
        else:
            with Databases("postgres", args.folder) as dbs:
                postgres_version = dbs.server_version()
    machine = Machine().collect(args.folder, postgres_version)
    started = time.perf_counter()
    figures: list[Figure] = []
    for backend in backends:
        figures += run_backend(backend, plan, args.sections, args.folder)
    machine["run time"] = f"{time.perf_counter() - started:.0f} s" + (
        " (--quick)" if args.quick else ""
    )
    if args.json:
        print(json.dumps(as_json(figures, machine), indent=2, ensure_ascii=False))
    else:
        print(markdown(figures, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
