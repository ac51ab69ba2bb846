"""The chat-turn path's statements: SQLAlchemy Core built from :mod:`zerda_store.db.schema`,
compiled once per store (:meth:`Store.statements`) for its dialect.

A save is one insert per table (multi-row ``VALUES``; on Postgres, beyond a few rows, one
array per column unnested in one statement); a recall is one statement. Building and
compiling do no I/O; an insert is prepared (compiled for its row count) before its
transaction begins, so that nothing but the statements runs inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect

from ..db.execution.driver import Runnable
from ..db.execution.multirow import compile_columns, compile_rows, row_placeholders, unnested_rows
from ..db.execution.statements import NameList, Statements, binds_arrays, dialect_insert
from ..db.execution.unit_of_work import Transaction
from ..db.schema import contexts, entities, extractions, in_same_session, insert_columns, turns
from ..identity.statements import resolution_possible
from ..model.names import UNKNOWN_TYPE

# Rows a multi-row INSERT carries at most (8 columns × 64 stays under every SQLite's limit
# of 999 parameters).
ROWS_PER_STATEMENT = 64
# Keys recalled by one statement on SQLite (more take several); Postgres takes any number.
RECALL_CHUNK = 32

# Postgres: up to this many rows an INSERT sends VALUES, cheapest for a turn's few rows;
# more go as one array per column, unnested in one statement whose text never changes
# (psycopg parses a long VALUES statement on every call, and sends arrays in binary).
POSTGRES_VALUES_ROWS = 8
# The row count that stands for "any number of rows" (the arrays form).
ANY_ROWS = 0
# What every row of one insert shares: sent once, not as an array.
SHARED = ("session_id",)

NEWEST_FIRST = (contexts.c.turn_seq.desc(), contexts.c.id.desc())
ENTITY_SELECT = (
    entities.c.id,
    entities.c.name,
    entities.c.name_key,
    entities.c.entity_type,
    entities.c.first_seen,
    entities.c.last_seen,
)


def recalled_entity(aged: bool) -> tuple[Any, ...]:
    """What a recall row carries of its entity: the name the memory string shows and the
    key it is grouped by, and under a policy the type its cutoff depends on. No more: on
    SQLite every column of a row costs the driver a value to make (seven fewer columns
    made a three-entity recall's statement a quarter quicker)."""
    return (entities.c.name, entities.c.name_key, *((entities.c.entity_type,) if aged else ()))


def _recall_each_key(count: int, aged: bool = False, marked: bool = False) -> Any:
    """SQLite: the newest ``:limit`` snippets of the session's entities keyed ``:key_0`` …,
    one ``UNION ALL`` part per key: the entity by its unique index, its snippets read
    backwards on the contexts index led by entity_id and cut at the limit (no temporary
    table per entity, as a list subquery builds). ``aged`` adds each snippet's creation
    time. ``marked``: one more row, whose ``context_id`` is NULL, says in
    ``resolution_possible`` whether name resolution can change what a mention that is its
    own core names (:func:`identity.statements.resolution_possible`)."""
    age = (contexts.c.created_at,) if aged else ()
    columns = (
        *recalled_entity(aged),
        contexts.c.text,
        contexts.c.turn_seq,
        contexts.c.id.label("context_id"),
        *age,
    )
    # An integer (0 or 1) as SQLite gives it: no result processor on every row.
    unmarked = sa.type_coerce(sa.null(), sa.Integer).label("resolution_possible")
    parts: list[Any] = []
    for i in range(count):
        part = (
            sa.select(*columns, *((unmarked,) if marked else ()))
            .join_from(entities, contexts, contexts.c.entity_id == entities.c.id)
            .where(
                entities.c.session_id == sa.bindparam("session_id"),
                entities.c.name_key == sa.bindparam(f"key_{i}", type_=sa.String),
            )
            .order_by(*NEWEST_FIRST)
            .limit(sa.bindparam("limit"))
            .subquery(f"key_{i}")
        )
        parts.append(sa.select(*part.c).select_from(part))
    if marked:
        parts.append(
            sa.select(
                *(sa.null().label(name) for name in parts[0].selected_columns.keys()[:-1]),
                resolution_possible(sa.bindparam("session_id")).label("resolution_possible"),
            )
        )
    return sa.union_all(*parts) if len(parts) > 1 else parts[0]


def lateral_recall(aged: bool = False, keyed: Any = None) -> Any:
    """Postgres: the session's entities keyed ``:keys`` (unique index), each joined
    LATERAL to its newest ``:limit`` snippets (the contexts index led by entity_id, read
    backwards and cut at the limit). ``aged`` adds each snippet's creation time;
    ``keyed`` replaces the filter on the entities' keys."""
    age = (contexts.c.created_at,) if aged else ()
    newest = (
        sa.select(contexts.c.text, contexts.c.turn_seq, contexts.c.id.label("context_id"), *age)
        # The session as a constant too: Citus routes a LATERAL subquery to the session's
        # shard only when it names the session itself (a correlation is not enough).
        .where(
            in_same_session(contexts.c.entity_id, entities.c.id),
            contexts.c.session_id == sa.bindparam("session_id"),
        )
        .order_by(*NEWEST_FIRST)
        .limit(sa.bindparam("limit"))
        .lateral("newest")
    )
    selected = sa.select(
        *recalled_entity(aged),
        newest.c.text,
        newest.c.turn_seq,
        newest.c.context_id,
        *((newest.c.created_at,) if aged else ()),
    )
    return selected.join_from(entities, newest, sa.true()).where(
        entities.c.session_id == sa.bindparam("session_id"),
        entities.c.name_key == sa.any_(sa.bindparam("keys", type_=ARRAY(sa.String)))
        if keyed is None
        else keyed,
    )


# The recall's key parameters, ``key_0`` …, as many as a statement takes.
_KEY_NAMES = tuple(f"key_{i}" for i in range(RECALL_CHUNK))


def statement_sizes(count: int) -> list[int]:
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


class PreparedInsert:
    """An insert of a known number of rows, compiled: the statements that carry them."""

    __slots__ = ("_parts",)

    def __init__(self, parts: list[tuple[Runnable, int]]) -> None:
        self._parts = parts

    def run(self, transaction: Transaction, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Insert ``rows`` (as many as prepared); the rows the statements return."""
        if len(self._parts) == 1:
            return transaction.run(self._parts[0][0], rows)
        returned: list[Any] = []
        start = 0
        for statement, size in self._parts:
            returned += transaction.run(statement, rows[start : start + size])
            start += size
        return returned


class RowsInsert:
    """One kind of multi-row insert into ``table`` (its columns read from the schema), for
    one dialect. ``finish`` adds what the kind needs to the plain insert (RETURNING, ON
    CONFLICT). Compiled per row count, from the few sizes :func:`statement_sizes` gives."""

    def __init__(
        self, dialect: Dialect, table: sa.Table, finish: Callable[[Any], Any] = lambda i: i
    ) -> None:
        self.table = table
        self.columns = insert_columns(table)
        self._dialect = dialect
        self._insert = dialect_insert(dialect.name)
        self._finish = finish
        # Postgres: many rows as one array per column (not on Citus: :meth:`route`).
        self._arrays = binds_arrays(dialect)
        self._compiled: dict[int, Runnable] = {}
        self._all_compiled = False
        self._prepared: dict[int, PreparedInsert] = {}  # by row count, once met

    def prepare(self, count: int) -> PreparedInsert:
        """The statements for ``count`` rows, compiled on first use. On SQLite a statement
        carries at most ``ROWS_PER_STATEMENT`` rows; on Postgres more than
        ``POSTGRES_VALUES_ROWS`` rows go as one statement of arrays."""
        prepared = self._prepared.get(count)
        if prepared is None:
            if self._arrays and count > POSTGRES_VALUES_ROWS:
                parts = [(self._statement(ANY_ROWS), count)]
            else:
                parts = [(self._statement(size), size) for size in statement_sizes(count)]
            prepared = self._prepared[count] = PreparedInsert(parts)
        return prepared

    def route(self) -> None:
        """Send VALUES only, whatever the row count: Citus routes an INSERT ... VALUES to the
        session's shard, but plans an INSERT ... SELECT of arrays in parts
        (:mod:`db.sharding`)."""
        if self._arrays:
            self._arrays = False
            self._prepared = {}

    def compile_all(self) -> None:
        """Compile every statement some row count needs, so that inserts whose counts are
        known only inside a transaction (a streamed import) compile nothing there."""
        if self._all_compiled:
            return
        if self._arrays:
            sizes = {ANY_ROWS, *range(1, POSTGRES_VALUES_ROWS + 1)}
        else:
            sizes = {ROWS_PER_STATEMENT, *range(8, ROWS_PER_STATEMENT, 8), *range(1, 8)}
        for size in sizes:
            self._statement(size)
        self._all_compiled = True

    def _statement(self, size: int) -> Runnable:
        statement = self._compiled.get(size)
        if statement is None:
            table, columns = self.table, self.columns
            if size == ANY_ROWS:
                rows = unnested_rows(table, columns, SHARED)
                built = self._finish(self._insert(table).from_select(list(columns), rows))
                statement = compile_columns(built, self._dialect, table, columns, SHARED)
            else:
                built = self._finish(
                    self._insert(table).values(row_placeholders(table, columns, size))
                )
                statement = compile_rows(built, self._dialect, columns, size)
            self._compiled[size] = statement
        return statement


_UNKNOWN_TYPE_LITERAL = sa.literal_column("'" + UNKNOWN_TYPE.replace("'", "''") + "'", sa.String)


def entity_upsert(upsert: Any) -> Any:
    """Entities: insert or update by key. The first sighting moves to a turn with a smaller
    id than the entity's first turn (a repaired old turn, or a concurrent writer that
    committed later); ``last_seen`` never moves back; an unknown type takes a known one."""
    excluded = upsert.excluded
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
            # The type as a literal in the text: Citus runs an INSERT ... SELECT's update on
            # the shard with the statement's other parameters left untyped.
            "entity_type": sa.case(
                (entities.c.entity_type == _UNKNOWN_TYPE_LITERAL, excluded.entity_type),
                else_=entities.c.entity_type,
            ),
        },
    ).returning(entities.c.id, entities.c.name_key)


def _insert_turn_once(insert: Any) -> Any:
    """One turn, unless its idempotency key was used in the session (then no row)."""
    return insert.on_conflict_do_nothing(
        index_elements=[turns.c.session_id, turns.c.idempotency_key]
    ).returning(turns.c.id)


def _marked_turn() -> Any:
    """SQLite: one turn (:func:`_insert_turn_once`, values named after the columns) with the
    session's mark (``resolution_possible``, an integer: no result processor), read in the
    save's transaction: a save whose mentions are their own cores skips resolution."""
    types = {column: turns.c[column].type for column in insert_columns(turns)}
    types["entity_names"] = NameList()
    insert = sqlite.insert(turns).values(
        {column: sa.bindparam(column, type_=type_) for column, type_ in types.items()}
    )
    session = sa.bindparam("session_id", type_=turns.c.session_id.type)
    possible = sa.type_coerce(resolution_possible(session), sa.Integer)
    return _insert_turn_once(insert).returning(possible.label("resolution_possible"))


class TurnStatements(Statements):
    """The chat-turn path's statements for one dialect: one per store."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        # SQLite: a single save's turn, with the session's mark (None on Postgres, whose
        # recall resolves by one array of keys in its own statement).
        self.marked_turn = None if binds_arrays(dialect) else self.compiled(_marked_turn())
        self.turn = RowsInsert(dialect, turns, _insert_turn_once)
        self.turns = RowsInsert(dialect, turns, lambda insert: insert.returning(turns.c.id))
        self.entities = RowsInsert(dialect, entities, entity_upsert)
        self.contexts = RowsInsert(dialect, contexts)
        self.outcomes = RowsInsert(dialect, extractions)
        # Postgres: recall keys as one array.
        self._arrays = binds_arrays(dialect)

    def route_inserts(self) -> None:
        """Inserts as VALUES only, for a database distributed by Citus (:meth:`RowsInsert.route`)."""
        for insert in (self.turn, self.turns, self.entities, self.contexts, self.outcomes):
            insert.route()

    def _recall_statement(self, count: int, aged: bool, marked: bool = False) -> Runnable:
        def build() -> Runnable:
            if self._arrays:
                return self.compiled(lateral_recall(aged))
            return self.compiled(_recall_each_key(count, aged, marked))

        return self.per_count((count, aged, marked), build)

    def recall_batches(
        self,
        session_id: str,
        keys: list[str],
        limit: int,
        *,
        aged: bool = False,
        marked: bool = False,
    ) -> list[tuple[Runnable, dict[str, Any]]]:
        """The recall statements for ``keys`` with their values: one on Postgres, one per
        ``RECALL_CHUNK`` keys on SQLite. ``aged``: the rows carry ``created_at`` too.
        ``marked`` (SQLite): the first statement also returns the session's mark
        (:func:`_recall_each_key`)."""
        if not keys:
            return []
        if self._arrays:
            values = {"session_id": session_id, "limit": limit, "keys": keys}
            return [(self._recall_statement(ANY_ROWS, aged), values)]
        if len(keys) > RECALL_CHUNK:  # one statement per chunk, the first one marked
            first, rest = keys[:RECALL_CHUNK], keys[RECALL_CHUNK:]
            batches = self.recall_batches(session_id, first, limit, aged=aged, marked=marked)
            return batches + self.recall_batches(session_id, rest, limit, aged=aged)
        values = dict(zip(_KEY_NAMES, keys, strict=False))  # one name per key
        values["session_id"] = session_id
        values["limit"] = limit
        shape = (len(keys), aged, marked)  # found without building a closure: every recall's
        return [(self._per_count.get(shape) or self._recall_statement(*shape), values)]
