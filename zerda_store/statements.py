"""The chat-turn path's statements: SQLAlchemy Core built from :mod:`zerda_store.schema`,
compiled once for the store's dialect (:mod:`zerda_store.driver`).

A save is one insert per table (multi-row ``VALUES``; on Postgres, beyond a few rows, one
array per column unnested in one statement); a recall is one statement.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect

from .driver import (
    StatementRunner,
    compile_columns,
    compile_rows,
    compile_statement,
    row_placeholders,
    unnested_rows,
)
from .engine import StoreError
from .names import UNKNOWN_TYPE
from .schema import contexts, entities, extractions, turns

# Rows a multi-row INSERT carries at most (8 columns × 64 stays under every SQLite's limit
# of 999 parameters).
ROWS_PER_STATEMENT = 64
# Keys recalled by one statement on SQLite (more take several); Postgres takes any number.
RECALL_CHUNK = 32


TURN_COLUMNS = (
    "session_id",
    "input_text",
    "output_text",
    "entity_names",
    "created_at",
    "idempotency_key",
)
ENTITY_COLUMNS = (
    "session_id",
    "name_key",
    "name",
    "entity_type",
    "first_seen",
    "last_seen",
    "first_turn_id",
    "first_position",
)
CONTEXT_COLUMNS = ("session_id", "entity_id", "turn_id", "turn_seq", "text")
OUTCOME_COLUMNS = (
    "session_id",
    "turn_id",
    "extractor",
    "status",
    "error",
    "latency_ms",
    "entity_count",
    "attempts",
    "updated_at",
)
# Postgres: up to this many rows an INSERT sends VALUES, cheapest for a turn's few rows;
# more go as one array per column, unnested in one statement whose text never changes
# (psycopg parses a long VALUES statement on every call, and sends arrays in binary).
POSTGRES_VALUES_ROWS = 8
# The row count that stands for "any number of rows" (the arrays form).
ANY_ROWS = 0
# What every row of one insert shares: sent once, not as an array.
SHARED = ("session_id",)
# What each kind of multi-row insert writes: its table, and its columns in the table's
# column order (the order SQLAlchemy renders VALUES in).
ROWS = {
    "turn": (turns, TURN_COLUMNS),
    "turns": (turns, TURN_COLUMNS),
    "entities": (entities, ENTITY_COLUMNS),
    "contexts": (contexts, CONTEXT_COLUMNS),
    "outcomes": (extractions, OUTCOME_COLUMNS),
}


def _dialect_insert(dialect: str) -> Any:
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise StoreError(f"unsupported database {dialect!r}: zerda_store runs on SQLite and Postgres")


NEWEST_FIRST = (contexts.c.turn_seq.desc(), contexts.c.id.desc())
ENTITY_SELECT = (
    entities.c.id,
    entities.c.name,
    entities.c.name_key,
    entities.c.entity_type,
    entities.c.first_seen,
    entities.c.last_seen,
)


def _recall_by_keys(count: int) -> Any:
    """SQLite (no LATERAL): the session's entities keyed ``:key_0`` … (unique index),
    joined to the snippets whose ids are among each one's newest ``:limit`` (a correlated
    subquery on the contexts index led by entity_id, read backwards and cut at the
    limit), then fetched by primary key."""
    newest = contexts.alias("newest")
    newest_ids = (
        sa.select(newest.c.id)
        .where(newest.c.entity_id == entities.c.id)
        .order_by(newest.c.turn_seq.desc(), newest.c.id.desc())
        .limit(sa.bindparam("limit"))
        .correlate(entities)
    )
    keys = [sa.bindparam(f"key_{i}", type_=sa.String) for i in range(count)]
    return (
        sa.select(*ENTITY_SELECT, contexts.c.text, contexts.c.turn_seq, contexts.c.id)
        .join_from(entities, contexts, contexts.c.id.in_(newest_ids))
        .where(entities.c.session_id == sa.bindparam("session_id"), entities.c.name_key.in_(keys))
    )


def _recall_lateral(_count: int) -> Any:
    """Postgres: the session's entities keyed ``:keys`` (unique index), each joined
    LATERAL to its newest ``:limit`` snippets (the contexts index led by entity_id, read
    backwards and cut at the limit)."""
    newest = (
        sa.select(contexts.c.text, contexts.c.turn_seq, contexts.c.id.label("context_id"))
        .where(contexts.c.entity_id == entities.c.id)
        .order_by(*NEWEST_FIRST)
        .limit(sa.bindparam("limit"))
        .lateral("newest")
    )
    return (
        sa.select(*ENTITY_SELECT, newest.c.text, newest.c.turn_seq, newest.c.context_id)
        .join_from(entities, newest, sa.true())
        .where(
            entities.c.session_id == sa.bindparam("session_id"),
            entities.c.name_key == sa.any_(sa.bindparam("keys", type_=ARRAY(sa.String))),
        )
    )


@functools.cache
def _key_names(count: int) -> tuple[str, ...]:
    return tuple(f"key_{i}" for i in range(count))


def _statement_sizes(count: int) -> list[int]:
    """How many rows each statement of an insert of ``count`` rows carries: full
    statements, then a multiple of 8, then the rest. Few sizes, so few statements to
    compile, and at most three statements beyond the full ones."""
    sizes = [ROWS_PER_STATEMENT] * (count // ROWS_PER_STATEMENT)
    rest = count % ROWS_PER_STATEMENT
    if rest > 8:
        sizes.append(rest - rest % 8)
        rest %= 8
    if rest:
        sizes.append(rest)
    return sizes


class TurnStatements:
    """The chat-turn path's statements for one dialect, each built and compiled on first
    use (per row count, from the few sizes :func:`_statement_sizes` gives)."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._insert = _dialect_insert(dialect.name)
        # Postgres: many rows as one array per column, and recall keys as one array.
        self.arrays = dialect.name == "postgresql"
        self._compiled: dict[tuple[str, int], Any] = {}
        self._builders: dict[str, Callable[[int], Any]] = {
            "turn": self._turn_statement,
            "turns": lambda n: self._rows_insert(turns, TURN_COLUMNS, n).returning(turns.c.id),
            "entities": self._upsert_statement,
            "contexts": lambda n: self._rows_insert(contexts, CONTEXT_COLUMNS, n),
            "outcomes": lambda n: self._rows_insert(extractions, OUTCOME_COLUMNS, n),
            "recall": _recall_lateral if self.arrays else _recall_by_keys,
        }

    def get(self, kind: str, count: int) -> Any:
        """The ``kind`` statement for ``count`` rows (or keys), compiled on first use."""
        statement = self._compiled.get((kind, count))
        if statement is None:
            built = self._builders[kind](count)
            if kind not in ROWS:
                statement = compile_statement(built, self._dialect)
            elif count == ANY_ROWS:
                table, columns = ROWS[kind]
                statement = compile_columns(built, self._dialect, table, columns, SHARED)
            else:
                statement = compile_rows(built, self._dialect, ROWS[kind][1], count)
            self._compiled[kind, count] = statement
        return statement

    def _rows_insert(self, table: sa.Table, columns: Sequence[str], count: int) -> Any:
        """An INSERT of ``count`` rows as multi-row VALUES, or (``ANY_ROWS``, Postgres)
        of any number of rows unnested from one array per column."""
        if count == ANY_ROWS:
            rows = unnested_rows(table, columns, SHARED)
            return self._insert(table).from_select(list(columns), rows)
        return self._insert(table).values(row_placeholders(table, columns, count))

    def _turn_statement(self, _count: int) -> Any:
        return (
            self._rows_insert(turns, TURN_COLUMNS, 1)
            .on_conflict_do_nothing(index_elements=[turns.c.session_id, turns.c.idempotency_key])
            .returning(turns.c.id)
        )

    def _upsert_statement(self, count: int) -> Any:
        upsert = self._rows_insert(entities, ENTITY_COLUMNS, count)
        excluded = upsert.excluded
        # A turn with a smaller id than the entity's first turn (a repaired old turn, or a
        # concurrent writer that committed later) becomes the entity's first sighting.
        earlier = excluded.first_turn_id < entities.c.first_turn_id
        first_seen_fields = {
            column: sa.case((earlier, getattr(excluded, column)), else_=entities.c[column])
            for column in ("name", "first_seen", "first_turn_id", "first_position")
        }
        return upsert.on_conflict_do_update(
            index_elements=[entities.c.session_id, entities.c.name_key],
            set_={
                **first_seen_fields,
                "last_seen": sa.case(
                    (excluded.last_seen > entities.c.last_seen, excluded.last_seen),
                    else_=entities.c.last_seen,
                ),
                "entity_type": sa.case(
                    (entities.c.entity_type == UNKNOWN_TYPE, excluded.entity_type),
                    else_=entities.c.entity_type,
                ),
            },
        ).returning(entities.c.id, entities.c.name_key)

    def insert_rows(
        self, driver: StatementRunner, kind: str, rows: Sequence[Mapping[str, Any]]
    ) -> list[Any]:
        """Insert ``rows`` with the ``kind`` statement; the rows it returns. On SQLite a
        statement carries at most ``ROWS_PER_STATEMENT`` rows; on Postgres more than
        ``POSTGRES_VALUES_ROWS`` rows go as one statement of arrays."""
        if not rows:
            return []
        if self.arrays and len(rows) > POSTGRES_VALUES_ROWS:
            return driver.execute(self.get(kind, ANY_ROWS), rows)
        returned: list[Any] = []
        start = 0
        for size in _statement_sizes(len(rows)):
            returned += driver.execute(self.get(kind, size), rows[start : start + size])
            start += size
        return returned

    def recall_batches(
        self, session_id: str, keys: list[str], limit: int
    ) -> list[tuple[Any, dict[str, Any]]]:
        """The recall statements for ``keys`` with their values: one on Postgres, one per
        ``RECALL_CHUNK`` keys on SQLite."""
        if self.arrays:
            values = {"session_id": session_id, "limit": limit, "keys": keys}
            return [(self.get("recall", ANY_ROWS), values)] if keys else []
        batches = []
        for start in range(0, len(keys), RECALL_CHUNK):
            chunk = keys[start : start + RECALL_CHUNK]
            values = {"session_id": session_id, "limit": limit}
            values.update(zip(_key_names(len(chunk)), chunk, strict=True))
            batches.append((self.get("recall", len(chunk)), values))
        return batches
