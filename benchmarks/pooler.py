"""What a transaction-mode pooler costs: one memory's ``save_context`` and
``load_memory_variables`` on a direct connection to Postgres against the same through
Debian's PgBouncer in transaction mode (the store opened with
``?prepared_statements=false``), in interleaved blocks on one database, so that a change in
the machine's load falls on both sides.

    python -m benchmarks.pooler [--turns 300] [--rounds 6]

Prints the median time per call on each route (µs) and the pooled-to-direct ratio per
block (min–max). The pooler is the tests' (``tests/servers.py``), started for the run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import sqlalchemy as sa

from tests import servers
from tests.doubles import POSTGRES_ADMIN_URL, KeywordLLM, new_postgres_database
from zerda_store import ConversationEntityMemory, Store, migrate

NAMES = [f"Customer{number}" for number in range(300)]


def _block(memory: ConversationEntityMemory, start: int, turns: int) -> tuple[float, float]:
    """Seconds per save and per recall over ``turns`` turns."""
    saving = recalling = 0.0
    for turn in range(start, start + turns):
        name = NAMES[turn % len(NAMES)]
        began = time.perf_counter()
        memory.save_context({"input": f"{name} met {NAMES[(turn * 7) % 300]}"}, {"output": "ok"})
        saved = time.perf_counter()
        memory.load_memory_variables({"input": name})
        recalling += time.perf_counter() - saved
        saving += saved - began
    return saving / turns, recalling / turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    arguments = parser.parse_args()
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    url, drop = new_postgres_database(admin)
    try:
        with Store(url) as store:
            migrate.upgrade(store)
        with servers.pgbouncer(mode="transaction", pool_size=4) as bouncer:
            pooled_url = bouncer.url(str(sa.make_url(url).database))
            with Store(url) as direct, Store(pooled_url) as pooled:
                routes = {
                    "direct": ConversationEntityMemory(
                        llm=KeywordLLM(NAMES), store=direct, session_id="direct"
                    ),
                    "pooled": ConversationEntityMemory(
                        llm=KeywordLLM(NAMES), store=pooled, session_id="pooled"
                    ),
                }
                for memory in routes.values():
                    _block(memory, 0, 50)  # connections opened, statements compiled
                figures: dict[str, list[tuple[float, float]]] = {name: [] for name in routes}
                for round_number in range(arguments.rounds):
                    order = list(routes) if round_number % 2 == 0 else list(reversed(routes))
                    for name in order:
                        start = 50 + round_number * arguments.turns
                        figures[name].append(_block(routes[name], start, arguments.turns))
    finally:
        drop()
        admin.dispose()
    with open("/proc/loadavg") as load:
        print(f"load average at the end: {load.read().split()[:3]}")
    for index, call in enumerate(("save", "recall")):
        direct = [block[index] for block in figures["direct"]]
        pooled = [block[index] for block in figures["pooled"]]
        ratios = [p / d for p, d in zip(pooled, direct, strict=True)]
        print(
            f"{call}: direct {statistics.median(direct) * 1e6:.0f} µs, through PgBouncer "
            f"(transaction mode) {statistics.median(pooled) * 1e6:.0f} µs; "
            f"ratio {min(ratios):.2f}–{max(ratios):.2f}"
        )


if __name__ == "__main__":
    main()
