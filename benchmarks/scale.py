"""Sections (d) recall latency against table size and (e) memory used by a big store.

Two stores are filled with the raw driver (fast, in one transaction): ~1k and ~200k
snippets. In both, a *cold* entity has one snippet from the very first turn and a *hot*
entity is named in many turns (half the small store, 5,000 snippets in the big one); the
rest are spread over contacts. The recall of one entity must cost about the same in both.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from zerda_store.model.names import name_key

from .databases import Database, Databases
from .floor import open_floor
from .report import Figure, ratio_figure
from .turns import ZerdaTurns
from .workload import Query, Samples, each_call, interleaved, render_recall

SESSION = "big-customer"
COLD = "Cold Account"
HOT = "Hot Account"
HOT_SNIPPETS_MAX = 5000
GROWTH_TARGET = 1.2
RSS_GROWTH_LIMIT_MB = 4.0


def fill(database: Database, snippets: int, *, analyze: bool = True) -> dict[str, int]:
    """Write ~``snippets`` snippets (three per turn) into a fresh database, in SQL on the
    server (a few hundred thousand rows take a second or two), then analyse it (unless
    ``analyze`` is false: ``fresh_plans`` measures before the statistics)."""
    turn_count = max(3, snippets // 3)
    hot_count = min(HOT_SNIPPETS_MAX, snippets // 2)
    params = {
        "session": SESSION,
        "turns": turn_count,
        "stride": max(1, turn_count // hot_count),
        "contacts": max(60, snippets // 100),
    }
    postgres = database.backend == "postgres"
    numbers = (
        "SELECT generate_series(1, :turns) AS t"
        if postgres
        else "WITH RECURSIVE n(t) AS (SELECT 1 UNION ALL SELECT t + 1 FROM n WHERE t < :turns)"
        " SELECT t FROM n"
    )
    engine = sa.create_engine(database.url)
    try:
        with engine.begin() as connection:
            for statement in _fill_statements(numbers, postgres):
                connection.execute(sa.text(statement), params)
            counts = connection.execute(
                sa.text(
                    "SELECT (SELECT count(*) FROM turns), (SELECT count(*) FROM entities),"
                    " (SELECT count(*) FROM contexts),"
                    " (SELECT count(*) FROM contexts WHERE entity_id = 2)"
                )
            ).one()
        if analyze:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                connection.exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()
    return dict(zip(("turns", "entities", "snippets", "hot"), map(int, counts), strict=True))


FILLER = (
    "asked for the signed renewal before Friday and a copy of the invoice for the finance "
    "team. Noted: a reminder goes out on Thursday with the last quote attached, and the "
    "discount stays as it was last year."
)


def _fill_statements(numbers: str, postgres: bool) -> list[str]:
    # Snippet (t, p) is the p-th entity of turn t: the cold entity first in turn 1, the hot
    # one first in every stride-th turn, contacts elsewhere (three different ones a turn).
    entity = (
        "CASE WHEN p = 0 AND t = 1 THEN 1 WHEN p = 0 AND t % :stride = 0 THEN 2"
        " ELSE 3 + (t * 3 + p) % :contacts END"
    )
    name = (
        "CASE entity_id WHEN 1 THEN 'Cold Account' WHEN 2 THEN 'Hot Account'"
        " ELSE 'Contact ' || (entity_id - 3) END"
    )
    # Postgres: the fill's rows are consistent by construction; skip the per-row FK triggers.
    statements = ["SET LOCAL session_replication_role = replica"] if postgres else []
    statements += [
        f"CREATE TEMP TABLE snips AS SELECT t, p, {entity} AS entity_id"
        f" FROM ({numbers}) AS numbers CROSS JOIN (SELECT 0 AS p UNION ALL SELECT 1"
        " UNION ALL SELECT 2) AS positions",
        "INSERT INTO turns (id, session_id, input_text, output_text, entity_names, created_at)"
        " SELECT t, :session, 'Turn ' || t || ': Cold Account asked', 'Noted.',"
        " '[\"Contact\"]', 1700000000.0 + t FROM snips WHERE p = 0",
        "INSERT INTO entities (id, session_id, name_key, core_key, name, entity_type,"
        " first_seen, last_seen, first_turn_id, first_position)"
        f" SELECT entity_id, :session, lower({name}), lower({name}), {name}, 'unknown',"
        " 1700000000.0 + min(t), 1700000000.0 + max(t), min(t * 3 + p) / 3, min(t * 3 + p) % 3"
        " FROM snips GROUP BY entity_id",
        "INSERT INTO contexts (id, session_id, entity_id, turn_id, turn_seq, text, created_at)"
        f" SELECT (t - 1) * 3 + p + 1, :session, entity_id, t, t, 'Turn ' || t || ': ' ||"
        f" '{FILLER}', 1700000000.0 + t FROM snips ORDER BY t, p",
        "DROP TABLE snips",
    ]
    if postgres:
        statements += [
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
            for table in ("turns", "entities", "contexts")
        ]
    return statements


def recall_growth(
    dbs: Databases, small: int, large: int, calls: int, rounds: int
) -> tuple[list[Figure], dict[str, Database]]:
    """(d): p50 latency of recalling one cold or hot entity in a small and a large store."""
    stores = {"small": dbs.get("small"), "large": dbs.get("large")}
    sizes = {
        label: fill(database, n)
        for (label, database), n in zip(stores.items(), (small, large), strict=True)
    }
    zerda = {label: ZerdaTurns(db, SESSION) for label, db in stores.items()}
    floors = {label: open_floor(db) for label, db in stores.items()}
    keys = {COLD: name_key(COLD), HOT: name_key(HOT)}
    queries = {name: Query(f"What happened with {name}?", (name,)) for name in (COLD, HOT)}

    def zerda_load(label: str, name: str) -> Any:
        return lambda _: zerda[label].load(queries[name])

    def floor_load(label: str, name: str) -> Any:
        return lambda _: render_recall(floors[label].recall(SESSION, [keys[name]]))

    variants: dict[str, Any] = {}
    for label in stores:
        for name in (COLD, HOT):
            for who, make in (("zerda", zerda_load), ("floor", floor_load)):
                work = make(label, name)
                each_call(work, 20)
                variants[f"{who}|{label}|{name}"] = lambda _r, w=work: statistics.median(
                    each_call(w, calls)
                )
    try:
        same = all(
            zerda[label].load(queries[name])
            == render_recall(floors[label].recall(SESSION, [keys[name]]))
            for label in stores
            for name in (COLD, HOT)
        )
        samples = interleaved(variants, rounds)
    finally:
        for memory in zerda.values():
            memory.close()
        for floor in floors.values():
            floor.close()
    figures = []
    for name, kind in ((COLD, "cold entity (1 old snippet)"), (HOT, "hot entity")):
        floor_small = samples[f"floor|small|{name}"]
        floor_large = samples[f"floor|large|{name}"]
        hot_note = (
            f", {sizes['small']['hot']:,} → {sizes['large']['hot']:,} snippets"
            if name == HOT
            else ""
        )
        figures.append(
            ratio_figure(
                "d",
                dbs.backend,
                f"load p50, {kind}{hot_note}: {sizes['large']['snippets']:,} vs "
                f"{sizes['small']['snippets']:,} stored snippets",
                samples[f"zerda|large|{name}"],
                samples[f"zerda|small|{name}"],
                f"{sizes['small']['snippets']:,}",
                limit=GROWTH_TARGET,
                note=(
                    f"floor {floor_small.median * 1e6:.0f} → {floor_large.median * 1e6:.0f} µs"
                    f" ({floor_large.median / floor_small.median:.2f}×)"
                    + ("" if same else "; LOAD OUTPUTS DIFFER")
                ),
            )
        )
    return figures, stores


def rss_growth(backend: str, stores: dict[str, Database], rounds: int) -> list[Figure]:
    """(e): resident memory a fresh process gains by opening each store and using it."""

    def probe_of(database: Database) -> Callable[[int], float]:
        return lambda _round: _probe(database)

    samples: dict[str, Samples] = interleaved(
        {label: probe_of(database) for label, database in stores.items()}, rounds
    )
    figure = ratio_figure(
        "e",
        backend,
        "RSS gained by a process that opens the large store, loads 2 entities, reads stats, "
        "len(entity_store), chat_memory[-1]",
        samples["large"],
        samples["small"],
        "small store",
        unit="MB",
    )
    difference = samples["large"].median - samples["small"].median
    figure.target = f"≤ +{RSS_GROWTH_LIMIT_MB:g} MB over small"
    figure.met = difference <= RSS_GROWTH_LIMIT_MB
    figure.note = f"difference {difference:+.1f} MB"
    return [figure]


def _probe(database: Database) -> float:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.rss_probe", database.url, SESSION, COLD, HOT],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(result.stdout)
    return float(report["after_mb"] - report["before_mb"])
