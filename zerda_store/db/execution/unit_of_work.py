"""The unit of work: one transaction on a pooled driver connection, run again whole when
that is safe, with the driver's errors turned into zerda_store's (:mod:`execution.failures`).

Every write of the library runs as ``store.write(work)``: ``work`` gets a
:class:`Transaction` and runs statements compiled beforehand (outside the transaction,
so that SQLite's write lock is held only while statements run). SQLite write transactions
begin IMMEDIATE here and nowhere else. On Postgres a write that names its session takes
that session's advisory lock first: shared for saves, exclusive for operations that must
see every save committed before them (erasure, clear, import); SQLite's single writer
serializes them already.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError

from ...telemetry import units
from ...telemetry.operations import current as observed_operation
from ..connections.settings import milliseconds
from ..sharding import LOCK_FUNCTION, distributed
from .driver import CompiledStatement, Cursor, Runnable, compile_statement, kept_cursor
from .failures import (
    WRITE_ATTEMPTS,
    Described,
    LostCommit,
    backoff,
    failure,
    is_connection_lost,
    retryable_read,
    retryable_write,
)

logger = logging.getLogger("zerda_store.unit_of_work")

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")
# The first key of the session locks (advisory locks with two int4 keys, a key space apart
# from the migrations' one bigint key); the second is the session id's hash.
SESSION_LOCK_NAMESPACE = 0x7A657273


class SessionLockStatements:
    """The Postgres statements that take a session's advisory lock for the transaction."""

    def __init__(self, dialect: Dialect) -> None:
        self.shared = self._lock(dialect, sa.func.pg_advisory_xact_lock_shared)
        self.exclusive = self._lock(dialect, sa.func.pg_advisory_xact_lock)
        # Citus: the same lock, exclusive, on the worker that holds the session's shard,
        # where a save delegated there takes it shared (``turns.delegated``); asked for only
        # where the function is (a database ``db distribute`` of this release has run on).
        signature: Any = sa.literal_column(f"'{LOCK_FUNCTION}(varchar, boolean, integer)'")
        self.worker_lock_exists = compile_statement(
            sa.select(sa.func.to_regprocedure(signature).is_not(None)), dialect
        )
        self.exclusive_on_worker = compile_statement(
            sa.select(
                getattr(sa.func, LOCK_FUNCTION)(
                    sa.bindparam("session_id", type_=sa.String),
                    sa.true(),
                    sa.bindparam("lock_timeout_ms", type_=sa.Integer),
                )
            ),
            dialect,
        )

    @staticmethod
    def _lock(dialect: Dialect, function: Any) -> CompiledStatement:
        session = sa.func.hashtext(sa.bindparam("session_id", type_=sa.String))
        return compile_statement(
            sa.select(function(sa.literal(SESSION_LOCK_NAMESPACE, sa.Integer), session)),
            dialect,
        )


@dataclass(frozen=True)
class SessionLock:
    """Which session a write belongs to, and whether it must exclude the session's saves."""

    session_id: str
    exclusive: bool = False


class Transaction:
    """What a unit of work sees: compiled statements run in its one transaction."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Cursor) -> None:
        self._cursor = cursor

    def run(self, statement: Runnable, values: Any = None) -> list[Any]:
        """Run ``statement``; the named rows it returns (none without RETURNING)."""
        return self._cursor.execute(statement, {} if values is None else values)

    def run_all(self, batches: Sequence[tuple[Runnable, Any]]) -> list[Any]:
        """Run each statement with its values; the rows of all of them, in order."""
        return [row for statement, values in batches for row in self.run(statement, values)]

    def count(self, statement: Runnable, values: Any = None) -> int:
        """Run a statement that returns no rows; how many rows it changed."""
        return self._cursor.execute_count(statement, {} if values is None else values)

    def run_many(self, statement: Runnable, values: Sequence[Any]) -> int:
        """Run a statement that returns no rows once per values; how many rows it changed."""
        return self._cursor.execute_many(statement, values) if values else 0


class OneStatement(Generic[T]):
    """A read of one statement and what to make of its rows (``statement`` None: nothing
    to read, ``then([])``). A unit of work like any other; the async path sends it from
    the event loop itself on Postgres (:mod:`aio.loop_reads`)."""

    __slots__ = ("statement", "then", "values")

    def __init__(
        self, statement: Runnable | None, values: Any, then: Callable[[list[Any]], T]
    ) -> None:
        self.statement = statement
        self.values = values
        self.then = then

    def __call__(self, transaction: Transaction) -> T:
        if self.statement is None:
            return self.then([])
        return self.then(transaction.run(self.statement, self.values))


def write(
    store: Database,
    work: Callable[[Transaction], T],
    lock: SessionLock | None = None,
    *,
    before_commit: Callable[[], None] | None = None,
) -> T:
    """Run ``work`` in one write transaction, again from scratch after a deadlock, a
    serialization failure or a connection lost before the commit. A connection lost during
    the COMMIT itself is not retried: the server may have committed. ``before_commit`` runs
    right before COMMIT is sent; whatever it raises rolls the transaction back."""
    locked_work = locked(store, work, lock)
    # write=True, snapshot=False, given by position: keywords would cost a dict a unit.
    return with_retries(
        store, retryable_write, attempt, store, locked_work, True, False, before_commit
    )


def read(store: Database, work: Callable[[Transaction], T], *, snapshot: bool = False) -> T:
    """Run ``work``, reads only. Without ``snapshot`` there is no transaction around it (a
    single statement sees one snapshot by itself; on Postgres this saves BEGIN and COMMIT);
    with it, every statement sees the same snapshot. Run again on a fresh connection if the
    pooled one turned out dead."""
    # write=False, snapshot: by position, as in write().
    return with_retries(store, retryable_read, attempt, store, work, False, snapshot)


def locked(
    store: Database, work: Callable[[Transaction], T], lock: SessionLock | None
) -> Callable[[Transaction], T]:
    """``work`` preceded, on Postgres, by taking its session's advisory lock."""
    if lock is None or store.dialect != "postgresql":
        return work
    locks = store.statements(SessionLockStatements)
    statement = locks.exclusive if lock.exclusive else locks.shared
    values = {"session_id": lock.session_id}
    # Citus: an exclusive lock is taken on the session's worker too, where the delegated
    # saves take theirs (whether the function is there is asked each time: a process that
    # read the catalog before ``db distribute`` made it must still exclude them).
    on_worker = lock.exclusive and distributed(store)

    def locked_work(transaction: Transaction) -> T:
        units.locking(transaction.run, statement, values)  # its wait, when observed
        if on_worker and transaction.run(locks.worker_lock_exists, None)[0][0]:
            waited = {**values, "lock_timeout_ms": milliseconds(store.lock_timeout)}
            units.locking(transaction.run, locks.exclusive_on_worker, waited)
        return work(transaction)

    return locked_work


def writers_poll(dialect: str) -> bool:
    """Whether writers waiting for the write lock poll for it rather than queue (SQLite's
    busy handler): a writer of many batches then pauses between them so that they get it."""
    return dialect == "sqlite"


def with_retries(
    store: Database,
    retryable: Callable[[DBAPIError], bool],
    attempt: Callable[P, T],
    *arguments: P.args,
    **keywords: P.kwargs,
) -> T:
    """``attempt(*arguments, **keywords)``, run again while ``retryable`` allows, at most
    ``WRITE_ATTEMPTS`` times in all, backing off between attempts; the function is called
    directly, not through a closure made for each unit of work."""
    if observed_operation.get() is not None and units.outside_a_unit():  # its span
        kind = "write" if retryable is retryable_write else "read"
        observed = units.run(kind, with_retries, store, retryable, attempt, *arguments, **keywords)
        return cast(T, observed)
    number = 1
    while True:
        try:
            return attempt(*arguments, **keywords)
        except (LostCommit, DBAPIError) as exc:
            raised = failure(store, exc, number, retryable)
            if raised is not None:
                raise raised from raised.__cause__
            if number >= WRITE_ATTEMPTS:  # failure() gives up there: never run past it
                raise AssertionError("a unit of work ran past its last attempt") from exc
            units.retried(number, exc)
        time.sleep(backoff(number))
        number += 1


def _begin(cursor: Cursor, connections: Connections, *, write: bool, snapshot: bool) -> None:
    """Open the attempt's transaction. SQLite: IMMEDIATE for writes (a deferred BEGIN cannot
    wait for another writer once it has read), deferred for a snapshot read. Postgres: psycopg
    begins one by itself; a snapshot read asks for repeatable read; a store without prepared
    statements (behind a transaction-mode pooler) then gives the transaction its settings."""
    if connections.dialect == "sqlite":
        if write:
            units.locking(cursor.execute_sql, "BEGIN IMMEDIATE")
        elif snapshot:
            cursor.execute_sql("BEGIN DEFERRED")
        return
    if snapshot and not write:
        cursor.execute_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    settings = connections.transaction_settings
    if settings is not None:
        cursor.execute_sql(settings.sql)


class Connections(Protocol):
    """Where an attempt takes its connection (the :class:`Store`: its pool and the
    connections it keeps for the next unit of work)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def dialect(self) -> str: ...

    @property
    def transaction_settings(self) -> CompiledStatement | None: ...

    @property
    def reads_need_settings(self) -> bool: ...

    def borrow(self) -> Any: ...

    def give_back(self, connection: Any, *, reusable: bool) -> None: ...

    def drop_connections(self) -> None: ...


class Database(Connections, Described, Protocol):
    """What a unit of work needs of the store (:class:`~zerda_store.db.store.Store` is one): its pool,
    its compiled statements, and how its errors are told without a secret."""

    def statements(self, factory: Callable[[Dialect], S]) -> S: ...

    def check_writable(self) -> None: ...

    def connect(self) -> AbstractContextManager[Connection]: ...

    @property
    def lock_timeout(self) -> float: ...


def attempt(
    connections: Connections,
    work: Callable[[Transaction], T],
    write: bool,
    snapshot: bool,
    before_commit: Callable[[], None] | None = None,
) -> T:
    """One attempt of ``work`` on a pooled driver connection. Driver errors come out as
    SQLAlchemy's :class:`DBAPIError` subclasses; after a lost connection the pool's other
    connections are dropped too (they are most likely gone with it). Anything else (a
    cancelled task, for one) rolls back: the connection goes back to the pool, which
    rolls back whatever is left open."""
    dialect = connections.engine.dialect
    connection = connections.borrow()
    cursor = None
    postgres = connections.dialect == "postgresql"
    # A read is one statement with no transaction around it, unless it needs the store's
    # settings (a schema's search_path) sent in one (behind a transaction-mode pooler).
    transaction = write or snapshot or connections.reads_need_settings
    autocommit = postgres and not transaction
    committing = False
    clean = False
    driver = None
    try:
        if autocommit:
            connection.dbapi_connection.autocommit = True
        cursor = kept_cursor(connection) if postgres else connection.dbapi_connection.cursor()
        driver = Cursor(dialect, cursor)
        if transaction:
            _begin(driver, connections, write=write, snapshot=snapshot)
        result = work(Transaction(driver))
        if write:
            if before_commit is not None:
                before_commit()
            committing = True
            dialect.do_commit(connection)
        elif transaction:
            dialect.do_rollback(connection)
        clean = True
        return result
    except dialect.loaded_dbapi.Error as orig:
        raise driver_failure(connections, connection, orig, cursor, committing=committing) from orig
    finally:
        if driver is not None and units.current_unit.get() is not None:  # observed
            units.sent(driver.sent, _round_trips(driver.sent, postgres, transaction, clean))
        return_connection(connections, connection, cursor, autocommit, clean)


def _round_trips(statements: int, postgres: bool, transaction: bool, ended: bool) -> int:
    """The times an attempt waited for the server: each statement, and in a transaction
    psycopg's BEGIN before the first and the COMMIT or ROLLBACK that ``ended`` it (none
    on SQLite, which runs in the process)."""
    if not postgres:
        return 0
    if not transaction or not statements:
        return statements
    return statements + 1 + int(ended)


def driver_failure(
    connections: Connections, connection: Any, orig: Exception, cursor: Any, *, committing: bool
) -> Exception:
    """What an attempt raises for the driver's error ``orig``: SQLAlchemy's
    :class:`DBAPIError` for it, or :class:`LostCommit` when the connection was lost while
    ``committing``. A lost connection is dropped, and the pool's others with it."""
    dialect = connections.engine.dialect
    lost = is_connection_lost(dialect, orig, connection.dbapi_connection, cursor)
    if lost:
        connection.invalidate(orig)
        connections.drop_connections()
    error = cast(
        DBAPIError,
        DBAPIError.instance(
            None,
            None,
            orig,
            dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=dialect,
        ),
    )
    return LostCommit(error) if committing and lost else error


def return_connection(
    connections: Connections, connection: Any, cursor: Any, autocommit: bool, clean: bool
) -> None:
    """Give a driver-level connection back: kept for the next unit of work if the attempt
    left no transaction open, else to the pool, which rolls back whatever is left; one that
    cannot be reset is dropped instead. A SQLite unit's cursor is closed (a Postgres one's
    is the connection's own: :func:`driver.kept_cursor`)."""
    try:
        if cursor is not None and connections.dialect == "sqlite":
            cursor.close()
        if autocommit and connection.is_valid:
            connection.dbapi_connection.autocommit = False
    except Exception as exc:
        if connection.is_valid:  # not dropped already as lost (a warning if it were)
            connection.invalidate(exc)
        clean = False
    connections.give_back(connection, reusable=clean and connection.is_valid)
