"""The floor: zerda_store's per-turn work written by hand on the raw driver.

stdlib ``sqlite3`` with zerda_store's connection settings (WAL, ``synchronous=FULL``,
``busy_timeout``, foreign keys, ``BEGIN IMMEDIATE`` for writes) and psycopg 3 for Postgres,
one connection held open, no pool. It does the same database work on the same tables, in
the form that is quickest by hand:

- save: in one transaction, insert the turn (``ON CONFLICT DO NOTHING RETURNING id``),
  upsert its entities in key order with one multi-row ``INSERT … ON CONFLICT DO UPDATE …
  RETURNING``, insert one snippet per entity, and (when the schema has the extraction
  ledger) the turn's ledger row; then commit. ``save_many`` does the same for every turn
  of a batch in one transaction.
- load: in one read transaction, find the entities by key, then the last three snippets of
  each, newest first by ``(turn_seq, id)`` through the index led by ``entity_id`` (on
  SQLite this beats any single statement by a few microseconds; zerda_store sends one).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from .databases import Database
from .workload import KEYS, RECALL_LIMIT, Turn, render_recall

SQLITE_BUSY_TIMEOUT_MS = 5000

INSERT_TURN = (
    "INSERT INTO turns (session_id, input_text, output_text, entity_names, created_at,"
    " idempotency_key) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (session_id, idempotency_key) DO NOTHING RETURNING id"
)
ENTITY_COLUMNS = (
    "session_id, name_key, core_key, name, entity_type, first_seen, last_seen, first_turn_id,"
    " first_position"
)
_EARLIER = "excluded.first_turn_id < entities.first_turn_id"
UPSERT_SET = ", ".join(
    [
        *(
            f"{column} = CASE WHEN {_EARLIER} THEN excluded.{column} ELSE entities.{column} END"
            for column in ("name", "first_seen", "first_turn_id", "first_position")
        ),
        "last_seen = CASE WHEN excluded.last_seen > entities.last_seen"
        " THEN excluded.last_seen ELSE entities.last_seen END",
        "entity_type = CASE WHEN entities.entity_type = 'unknown'"
        " THEN excluded.entity_type ELSE entities.entity_type END",
    ]
)
INSERT_CONTEXT_COLUMNS = "session_id, entity_id, turn_id, turn_seq, text, created_at"
INSERT_LEDGER = (
    "INSERT INTO extractions (session_id, turn_id, extractor, status, error, latency_ms,"
    " entity_count, attempts, updated_at) VALUES (?, ?, 'llm', 'ok', NULL, 0.0, ?, 1, ?)"
)
RECENT = "SELECT text FROM contexts WHERE entity_id = ? ORDER BY turn_seq DESC, id DESC LIMIT ?"


def _values(row_count: int, width: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    return ", ".join([row] * row_count)


@functools.cache
def upsert_entities_sql(row_count: int) -> str:
    return (
        f"INSERT INTO entities ({ENTITY_COLUMNS}) VALUES {_values(row_count, 9)}"
        f" ON CONFLICT (session_id, name_key) DO UPDATE SET {UPSERT_SET}"
        " RETURNING id, name_key"
    )


@functools.cache
def insert_contexts_sql(row_count: int) -> str:
    return f"INSERT INTO contexts ({INSERT_CONTEXT_COLUMNS}) VALUES {_values(row_count, 6)}"


@functools.cache
def find_entities_sql(key_count: int) -> str:
    marks = ", ".join("?" * key_count)
    return (
        "SELECT id, name, name_key, entity_type, first_seen, last_seen FROM entities"
        f" WHERE session_id = ? AND name_key IN ({marks})"
    )


def _entity_rows(session_id: str, turn_id: int, turn: Turn, at: float) -> list[Any]:
    """The upsert's parameters, flat, in key order (the deadlock-free order)."""
    ordered = sorted((KEYS[name], position, name) for position, name in enumerate(turn.names))
    flat: list[Any] = []
    for key, position, name in ordered:
        flat += [session_id, key, key, name, "unknown", at, at, turn_id, position]
    return flat


class Floor:
    """The shared shape of both floors; subclasses supply the connection and SQL dialect."""

    placeholder = "?"

    def __init__(self, database: Database) -> None:
        self.ledger = database.has_ledger

    def sql(self, statement: str) -> str:
        return statement

    def save(self, session_id: str, turn: Turn) -> int:
        """One turn in its own transaction."""
        return self.save_many(session_id, [turn])[0]

    def save_many(self, session_id: str, turns: Sequence[Turn]) -> list[int]:
        """Turns in one transaction, each with the statements of a single save."""
        raise NotImplementedError

    def recall(self, session_id: str, keys: Sequence[str]) -> list[tuple[str, list[str]]]:
        raise NotImplementedError

    def load(self, session_id: str, names: Sequence[str]) -> str:
        """The memory string for a query naming ``names`` (keys come precomputed)."""
        return render_recall(self.recall(session_id, [KEYS[name] for name in names]))

    def close(self) -> None:
        raise NotImplementedError


class SqliteFloor(Floor):
    def __init__(self, database: Database, *, durable: bool = True) -> None:
        super().__init__(database)
        self.db = sqlite3.connect(
            database.address, isolation_level=None, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000
        )
        for pragma in (
            "PRAGMA journal_mode=WAL",
            "PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=NORMAL",
            f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
            "PRAGMA foreign_keys=ON",
        ):
            self.db.execute(pragma)

    def save_many(self, session_id: str, turns: Sequence[Turn]) -> list[int]:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            ids = [self._save(session_id, turn) for turn in turns]
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return ids

    def _save(self, session_id: str, turn: Turn) -> int:
        db = self.db
        at = time.time()
        names = json.dumps(list(turn.names))
        row = (session_id, turn.input_text, turn.output_text, names, at, None)
        turn_id = db.execute(INSERT_TURN, row).fetchone()[0]
        flat = _entity_rows(session_id, turn_id, turn, at)
        ids = dict(db.execute(upsert_entities_sql(len(turn.names)), flat).fetchall())
        by_key = {key: entity_id for entity_id, key in ids.items()}
        text = turn.text
        db.executemany(
            insert_contexts_sql(1),
            [(session_id, by_key[KEYS[name]], turn_id, turn_id, text, at) for name in turn.names],
        )
        if self.ledger:
            db.execute(INSERT_LEDGER, (session_id, turn_id, len(turn.names), at))
        return int(turn_id)

    def recall(self, session_id: str, keys: Sequence[str]) -> list[tuple[str, list[str]]]:
        db = self.db
        db.execute("BEGIN")
        try:
            rows = db.execute(find_entities_sql(len(keys)), (session_id, *keys)).fetchall()
            found = {row[2]: row for row in rows}
            recalled = []
            for key in keys:
                row = found.get(key)
                if row is not None:
                    newest = db.execute(RECENT, (row[0], RECALL_LIMIT)).fetchall()
                    recalled.append((row[1], [text for (text,) in reversed(newest)]))
        finally:
            db.execute("COMMIT")
        return recalled

    def recent(self, entity_id: int) -> list[str]:
        """The last snippets of one entity, outside any explicit transaction."""
        newest = self.db.execute(RECENT, (entity_id, RECALL_LIMIT)).fetchall()
        return [text for (text,) in reversed(newest)]

    def close(self) -> None:
        self.db.close()


class PostgresFloor(Floor):
    def __init__(self, database: Database, *, durable: bool = True) -> None:
        import psycopg

        super().__init__(database)
        self.db = psycopg.connect(database.address, autocommit=False)
        if not durable:
            self.db.execute("SET synchronous_commit TO off")
            self.db.commit()

    @staticmethod
    @functools.cache
    def _pg(statement: str) -> str:
        # psycopg sends a str with no type, so Postgres casts it into the json column.
        return statement.replace("?", "%s")

    def save_many(self, session_id: str, turns: Sequence[Turn]) -> list[int]:
        db = self.db
        with db.cursor() as cursor:
            try:
                ids = [self._save(cursor, session_id, turn) for turn in turns]
                db.commit()
            except BaseException:
                db.rollback()
                raise
        return ids

    def _save(self, cursor: Any, session_id: str, turn: Turn) -> int:
        at = time.time()
        names = json.dumps(list(turn.names))
        row = (session_id, turn.input_text, turn.output_text, names, at, None)
        turn_id = cursor.execute(self._pg(INSERT_TURN), row).fetchone()[0]
        flat = _entity_rows(session_id, turn_id, turn, at)
        cursor.execute(self._pg(upsert_entities_sql(len(turn.names))), flat)
        by_key = {key: entity_id for entity_id, key in cursor.fetchall()}
        text = turn.text
        snippets: list[Any] = []
        for name in turn.names:
            snippets += [session_id, by_key[KEYS[name]], turn_id, turn_id, text, at]
        cursor.execute(self._pg(insert_contexts_sql(len(turn.names))), snippets)
        if self.ledger:
            cursor.execute(self._pg(INSERT_LEDGER), (session_id, turn_id, len(turn.names), at))
        return int(turn_id)

    def recall(self, session_id: str, keys: Sequence[str]) -> list[tuple[str, list[str]]]:
        db = self.db
        with db.cursor() as cursor:
            try:
                cursor.execute(self._pg(find_entities_sql(len(keys))), (session_id, *keys))
                found = {row[2]: row for row in cursor.fetchall()}
                recalled = []
                for key in keys:
                    row = found.get(key)
                    if row is not None:
                        cursor.execute(self._pg(RECENT), (row[0], RECALL_LIMIT))
                        newest = cursor.fetchall()
                        recalled.append((row[1], [text for (text,) in reversed(newest)]))
            finally:
                db.rollback()
        return recalled

    def recent(self, entity_id: int) -> list[str]:
        with self.db.cursor() as cursor:
            cursor.execute(self._pg(RECENT), (entity_id, RECALL_LIMIT))
            newest = cursor.fetchall()
        self.db.rollback()
        return [text for (text,) in reversed(newest)]

    def close(self) -> None:
        self.db.close()


def open_floor(database: Database, *, durable: bool = True) -> Floor:
    if database.backend == "sqlite":
        return SqliteFloor(database, durable=durable)
    return PostgresFloor(database, durable=durable)
