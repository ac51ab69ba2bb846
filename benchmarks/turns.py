"""Sections (a) save_context, (b) load_memory_variables and (c) save_contexts.

(a) and (b) replay the same turns through zerda_store and through the floor, each into its
own database, in interleaved rounds; the loads of both must give the same memory string.
(c) imports turns with one ``save_contexts`` call per round and with a ``save_context``
loop, into two sessions of one database, and checks that both sessions hold the same rows.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa

from zerda_store import ConversationEntityMemory, Store

from .databases import Database, Databases
from .floor import open_floor
from .report import Figure, ratio_figure
from .workload import Query, ScriptedLLM, Turn, interleaved, make_queries, make_turns

SESSION = "customer-1"
WARM_UP = 40
# The ratios to the floor that issue #21 asks for.
SAVE_TARGETS = {"sqlite": 1.3, "postgres": 1.1}
LOAD_TARGETS = {"sqlite": 1.8, "postgres": 1.0}
BULK_SPEED_UP_TARGET = 10.0


class ZerdaTurns:
    """zerda_store's memory driven with a scripted model. ``durable=False`` lets commits
    return before the log reaches the disk (SQLite ``synchronous=NORMAL``, Postgres
    ``synchronous_commit=off``), which takes fsync noise out of a comparison."""

    def __init__(self, database: Database, session_id: str = SESSION, *, durable: bool = True):
        self.llm = ScriptedLLM()
        self.store = Store(database.url, durability="full" if durable else "normal")
        if not durable and database.backend == "postgres":
            sa.event.listen(self.store.engine, "connect", _no_commit_wait)
        self.memory = ConversationEntityMemory(self.llm, store=self.store, session_id=session_id)

    def save(self, turn: Turn) -> None:
        self.llm.answer = turn.answer
        self.memory.save_context({"input": turn.input_text}, {"output": turn.output_text})

    def load(self, query: Query) -> str:
        self.llm.answer = query.answer
        return str(self.memory.load_memory_variables({"input": query.input_text})["entity_info"])

    def save_many(self, turns: list[Turn]) -> None:
        self.llm.queue.extend(turn.answer for turn in turns)
        self.memory.save_contexts(
            ({"input": turn.input_text}, {"output": turn.output_text}) for turn in turns
        )

    def close(self) -> None:
        self.memory.close()
        self.store.close()


def _no_commit_wait(dbapi_connection: Any, _record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO off")
    dbapi_connection.commit()


def _blocks(items: list[Any], rounds: int) -> list[list[Any]]:
    size = len(items) // rounds
    return [items[i * size : (i + 1) * size] for i in range(rounds)]


def _timed_block(work: Any, block: list[Any]) -> float:
    started = time.perf_counter()
    for item in block:
        work(item)
    return (time.perf_counter() - started) / len(block)


def save_and_load(dbs: Databases, turn_count: int, rounds: int) -> list[Figure]:
    """(a) and (b): per-turn save and load, zerda_store against the floor."""
    zerda = ZerdaTurns(dbs.get("zerda"))
    floor = open_floor(dbs.get("floor"))
    turns = make_turns(WARM_UP + turn_count)
    queries = make_queries(WARM_UP + turn_count)
    try:
        for turn, query in zip(turns[:WARM_UP], queries[:WARM_UP], strict=True):
            zerda.save(turn)
            floor.save(SESSION, turn)
            zerda.load(query)
            floor.load(SESSION, query.names)
        save_blocks = _blocks(turns[WARM_UP:], rounds)
        load_blocks = _blocks(queries[WARM_UP:], rounds)
        saves = interleaved(
            {
                "zerda": lambda r: _timed_block(zerda.save, save_blocks[r]),
                "floor": lambda r: _timed_block(lambda t: floor.save(SESSION, t), save_blocks[r]),
            },
            rounds,
        )
        loads = interleaved(
            {
                "zerda": lambda r: _timed_block(zerda.load, load_blocks[r]),
                "floor": lambda r: _timed_block(
                    lambda q: floor.load(SESSION, q.names), load_blocks[r]
                ),
            },
            rounds,
        )
        same = all(zerda.load(q) == floor.load(SESSION, q.names) for q in queries[:50])
    finally:
        zerda.close()
        floor.close()
    backend = dbs.backend
    note = "" if same else "LOAD OUTPUTS DIFFER"
    return [
        ratio_figure(
            "a",
            backend,
            "save_context per turn",
            saves["zerda"],
            saves["floor"],
            "floor",
            limit=SAVE_TARGETS[backend],
        ),
        ratio_figure(
            "b",
            backend,
            "load_memory_variables per turn (3 entities)",
            loads["zerda"],
            loads["floor"],
            "floor",
            limit=LOAD_TARGETS[backend],
            note=note,
        ),
    ]


def bulk_import(dbs: Databases, turn_count: int, rounds: int) -> list[Figure]:
    """(c): save_contexts against a save_context loop, same turns, two sessions; and
    against the floor's bulk (a save's statements for every turn, in one transaction)."""
    database = dbs.get("zerda")
    bulk = ZerdaTurns(database, "bulk")
    loop = ZerdaTurns(database, "loop")
    floor = open_floor(dbs.get("floor"))
    blocks = _blocks(make_turns(turn_count, seed=3), rounds)
    try:

        def import_block(r: int) -> float:
            started = time.perf_counter()
            bulk.save_many(blocks[r])
            return (time.perf_counter() - started) / len(blocks[r])

        def floor_block(r: int) -> float:
            started = time.perf_counter()
            floor.save_many("bulk", blocks[r])
            return (time.perf_counter() - started) / len(blocks[r])

        samples = interleaved(
            {
                "bulk": import_block,
                "loop": lambda r: _timed_block(loop.save, blocks[r]),
                "floor": floor_block,
            },
            rounds,
        )
    finally:
        bulk.close()
        loop.close()
        floor.close()
    same = session_rows(database, "bulk") == session_rows(database, "loop")
    per_round = [
        loop / bulk
        for loop, bulk in zip(samples["loop"].values, samples["bulk"].values, strict=True)
    ]
    what = f"save_contexts per turn ({len(blocks[0])} turns a call)"
    figure = ratio_figure(
        "c",
        dbs.backend,
        what,
        samples["bulk"],
        samples["loop"],
        "save_context loop",
        note="same rows as the loop" if same else "ROWS DIFFER FROM THE LOOP",
    )
    figure.ratio = samples["loop"].median / samples["bulk"].median
    figure.inverse = True
    figure.target = f"loop ≥ {BULK_SPEED_UP_TARGET:g}× slower"
    figure.met = figure.ratio >= BULK_SPEED_UP_TARGET and same
    figure.note += f"; ratio is loop/bulk, {min(per_round):.1f}…{max(per_round):.1f}× by round"
    against_floor = ratio_figure(
        "c", dbs.backend, what, samples["bulk"], samples["floor"], "floor bulk"
    )
    return [figure, against_floor]


def session_rows(database: Database, session_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """A session's turns, entities and snippets without ids or clocks, turns numbered by
    their order, so that two sessions that saw the same turns compare equal."""
    engine = sa.create_engine(database.url)
    try:
        with engine.connect() as connection:
            turn_rows = connection.execute(
                sa.text(
                    "SELECT id, input_text, output_text, entity_names FROM turns"
                    " WHERE session_id = :s ORDER BY id"
                ),
                {"s": session_id},
            ).all()
            order = {row.id: n for n, row in enumerate(turn_rows)}
            entity_rows = connection.execute(
                sa.text(
                    "SELECT name_key, name, entity_type, first_turn_id, first_position"
                    " FROM entities WHERE session_id = :s"
                    " ORDER BY first_turn_id, first_position"
                ),
                {"s": session_id},
            ).all()
            snippet_rows = connection.execute(
                sa.text(
                    "SELECT e.name_key, c.turn_id, c.turn_seq, c.text FROM contexts c"
                    " JOIN entities e ON e.id = c.entity_id WHERE c.session_id = :s"
                    " ORDER BY c.turn_seq, c.id"
                ),
                {"s": session_id},
            ).all()
    finally:
        engine.dispose()
    return {
        "turns": [(r.input_text, r.output_text, _names(r.entity_names)) for r in turn_rows],
        "entities": [
            (r.name_key, r.name, r.entity_type, order[r.first_turn_id], r.first_position)
            for r in entity_rows
        ],
        "contexts": [
            (r.name_key, order[r.turn_id], order[r.turn_seq], r.text) for r in snippet_rows
        ],
    }


def _names(value: Any) -> tuple[str, ...]:
    return tuple(json.loads(value) if isinstance(value, str) else value)


def save_without_commit_wait(dbs: Databases, turn_count: int, rounds: int) -> list[Figure]:
    """(a) again with commits that do not wait for fsync on both sides, so that what is
    left is the work of the code, the driver and the database."""
    session_id = "customer-2"
    zerda = ZerdaTurns(dbs.get("zerda"), session_id, durable=False)
    floor = open_floor(dbs.get("floor"), durable=False)
    turns = make_turns(WARM_UP + turn_count, seed=4)
    try:
        for turn in turns[:WARM_UP]:
            zerda.save(turn)
            floor.save(session_id, turn)
        blocks = _blocks(turns[WARM_UP:], rounds)
        saves = interleaved(
            {
                "zerda": lambda r: _timed_block(zerda.save, blocks[r]),
                "floor": lambda r: _timed_block(lambda t: floor.save(session_id, t), blocks[r]),
            },
            rounds,
        )
    finally:
        zerda.close()
        floor.close()
    setting = "synchronous=NORMAL" if dbs.backend == "sqlite" else "synchronous_commit=off"
    return [
        ratio_figure(
            "a",
            dbs.backend,
            f"save_context per turn, no fsync wait ({setting} on both sides)",
            saves["zerda"],
            saves["floor"],
            "floor",
            limit=SAVE_TARGETS[dbs.backend],
        )
    ]
