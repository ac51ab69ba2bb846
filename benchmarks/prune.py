"""Pruning a big store to keep-last-3 per entity: how long it takes, and recall latency
before and after (it should stay flat: recall reads an index range whatever the size).

    python -m benchmarks.prune                      # SQLite, 200,000 snippets (~1 minute)
    python -m benchmarks.prune --snippets 1000000   # the issue's size (several minutes)
    python -m benchmarks.prune --backend postgres   # a scratch database on the local server

The store is written through the API (``save_contexts`` in chunks of 1,000 turns, four
entities a turn, ~100 snippets per entity), in one session.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from zerda_store import ConversationEntityMemory, Store, migrate
from zerda_store.db.store import core_of
from zerda_store.retention.pruning import Pruner

NAMES_PER_TURN = 4
SNIPPETS_PER_ENTITY = 100
CHUNK = 1_000
POSTGRES_ADMIN = os.environ.get(
    "ZERDA_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


class Listed:
    """Turns whose input starts with the names they mention, then `` | ``."""

    name = "listed"

    def extract(self, text: str) -> list[str]:
        return text.split(" | ", 1)[0].split(", ")


@contextmanager
def scratch_database(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/prune.db"
        return
    admin = sa.create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
    name = f"zerda_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(POSTGRES_ADMIN).set(database=name).render_as_string(False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def fill(memory: ConversationEntityMemory, snippets: int) -> int:
    turns = snippets // NAMES_PER_TURN
    entities = max(NAMES_PER_TURN, snippets // SNIPPETS_PER_ENTITY)
    for start in range(0, turns, CHUNK):
        pairs = []
        for turn in range(start, min(turns, start + CHUNK)):
            names = [f"Contact {(turn * NAMES_PER_TURN + k) % entities}" for k in range(4)]
            pairs.append(({"input": ", ".join(names) + f" | turn {turn}"}, {"output": "ok"}))
        memory.save_contexts(pairs)
    return entities


def recall_p50(memory: ConversationEntityMemory, entities: int, calls: int = 300) -> float:
    """Median milliseconds of one recall naming four entities."""
    samples = []
    for n in range(calls):
        names = [f"Contact {(n * 37 + k * 11) % entities}" for k in range(4)]
        query = {"input": ", ".join(names) + " | ?"}
        started = time.perf_counter()
        memory.load_memory_variables(query)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def run(backend: str, snippets: int, keep: int) -> dict[str, object]:
    with scratch_database(backend) as url, Store(url) as store:
        migrate.upgrade(store)
        memory = ConversationEntityMemory(store=store, session_id="big", extractor=Listed())
        started = time.perf_counter()
        entities = fill(memory, snippets)
        fill_s = time.perf_counter() - started
        if backend == "postgres":
            with store.engine.begin() as connection:
                connection.exec_driver_sql("ANALYZE")
        before = recall_p50(memory, entities)
        memory.set_retention(keep_last=keep)
        started = time.perf_counter()
        receipt = Pruner(core_of(store)).prune("big").as_dict()
        prune_s = time.perf_counter() - started
        after = recall_p50(memory, entities)
        return {
            "backend": backend,
            "snippets": snippets,
            "entities": entities,
            "keep_last": keep,
            "fill_seconds": round(fill_s, 1),
            "prune_seconds": round(prune_s, 1),
            "receipt": receipt,
            "recall_p50_ms_before": round(before, 3),
            "recall_p50_ms_after": round(after, 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--snippets", type=int, default=200_000)
    parser.add_argument("--keep", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(run(args.backend, args.snippets, args.keep), indent=2))


if __name__ == "__main__":
    main()
