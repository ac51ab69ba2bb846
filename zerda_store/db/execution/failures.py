"""Which driver errors mean what, and the error zerda_store raises for each: a lost commit,
a lock timeout, a refused write, a missing privilege, a cancelled statement, prepared
statements lost behind a transaction-mode pooler, a connection lost on every attempt, or any
other (the database's first line, its secrets masked). Shared
by the sync and the async units of work, which run an attempt again while it may help."""

from __future__ import annotations

import logging
import random
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.exc import DBAPIError

from ...errors import (
    CommitOutcomeUnknownError,
    DatabaseError,
    DatabaseUnavailableError,
    PermissionDeniedError,
    PoolerModeError,
    ReadOnlyStoreError,
    StatementTimeoutError,
    StoreError,
)

logger = logging.getLogger("zerda_store.unit_of_work")

WRITE_ATTEMPTS = 4
# Postgres SQLSTATEs after which the whole transaction was rolled back and may be run again.
_RETRYABLE_SQLSTATES = {"40P01", "40001"}


class Described(Protocol):
    """What telling a failure needs of the store: its dialect, and its URL and driver text
    with every secret masked."""

    @property
    def engine(self) -> Engine: ...

    @property
    def safe_url(self) -> str: ...

    @property
    def location(self) -> str: ...

    def describe(self, exc: BaseException) -> str: ...

    def lock_timeout_error(self, exc: BaseException) -> BaseException: ...


class LostCommit(Exception):
    """Raised inside one attempt: the connection died during COMMIT."""

    def __init__(self, error: DBAPIError) -> None:
        super().__init__(str(error))
        self.error = error


def retryable_write(error: DBAPIError) -> bool:
    sqlstate = getattr(error.orig, "sqlstate", None)
    return sqlstate in _RETRYABLE_SQLSTATES or error.connection_invalidated


def retryable_read(error: DBAPIError) -> bool:
    return error.connection_invalidated


def failure(
    store: Described, error: Exception, number: int, retryable: Callable[[DBAPIError], bool]
) -> BaseException | None:
    """What a failed attempt number ``number`` raises (always a :class:`StoreError`), or
    None when it runs again. Shared by the sync and the async units of work."""
    if isinstance(error, LostCommit) and is_pooler_refusal(error.error.orig):
        # The server answered the commit's batch with this error: nothing was committed.
        error = error.error
    if isinstance(error, LostCommit):
        raised: BaseException = CommitOutcomeUnknownError(
            f"the connection to {store.safe_url} was lost during a commit: the write may "
            "or may not be stored (pass idempotency_key= to make a retry safe)"
        )
        raised.__cause__ = error.error
        return raised
    assert isinstance(error, DBAPIError)
    if error.orig is not None and is_lock_timeout(store.engine.dialect, error.orig):
        raised = store.lock_timeout_error(error)
        raised.__suppress_context__ = True
        return raised
    if error.orig is not None and is_read_only_refusal(store.engine.dialect, error.orig):
        raised = ReadOnlyStoreError(
            f"{store.location} refuses writes ({store.describe(error)}): nothing was written"
        )
        raised.__suppress_context__ = True
        return raised
    if number == WRITE_ATTEMPTS or not retryable(error) or is_pooler_refusal(error.orig):
        return database_error(store, error)
    logger.warning("running a unit of work again after %s", type(error.orig).__name__)
    return None


def database_error(store: Described, error: DBAPIError) -> StoreError:
    """zerda_store's one-line error for a driver error that is not run again: a missing
    privilege, a statement the server cancelled, a connection lost on every attempt, or
    any other (the database's first line, its secrets masked). Nothing of the failed
    unit of work was stored: its transaction rolled back."""
    detail = store.describe(error)
    orig = error.orig if error.orig is not None else error
    raised: StoreError
    if is_pooler_refusal(orig):
        raised = PoolerModeError(
            f"{store.safe_url} lost a statement this store had prepared on the server "
            f"({detail}): it is most likely a transaction-mode pooler (PgBouncer's pool_mode = "
            "transaction), which gives each transaction another server connection. Open the "
            "store with prepared_statements=False (or add ?prepared_statements=false to the "
            "URL); nothing was written"
        )
    elif is_permission_denied(orig):
        raised = PermissionDeniedError(
            f"the database role of {store.safe_url} lacks a privilege zerda_store needs "
            f"({detail}): GRANT it SELECT, INSERT, UPDATE, DELETE on zerda_store's tables and "
            "USAGE on their sequences; nothing was written"
        )
    elif is_statement_cancelled(orig):
        raised = StatementTimeoutError(
            f"{store.safe_url} cancelled a statement ({detail}): the role's or database's "
            "statement_timeout ran out, or an operator cancelled it; nothing of this call was "
            "stored (raise statement_timeout, or find what holds the statement up)"
        )
    elif error.connection_invalidated:
        raised = DatabaseUnavailableError(
            f"lost the connection to {store.safe_url} on every attempt ({detail})"
        )
    else:
        raised = DatabaseError(f"database error on {store.location}: {detail}")
    raised.__suppress_context__ = True
    return raised


def backoff(number: int) -> float:
    """Seconds to wait before attempt ``number + 1``: two turns that just deadlocked should
    not collide again at once."""
    return random.uniform(0, 0.01 * 2**number)


# SQLite's code for "the database is locked" (the busy timeout ran out).
_SQLITE_BUSY = 5


def is_lock_timeout(dialect: Dialect, error: BaseException) -> bool:
    """True when the driver gave up waiting for a lock: Postgres's ``lock_timeout``
    (SQLSTATE 55P03) or SQLite's busy timeout."""
    if dialect.name == "postgresql":
        return getattr(error, "sqlstate", None) == "55P03"
    if not isinstance(error, sqlite3.OperationalError):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    return code == _SQLITE_BUSY or (code is None and "database is locked" in str(error))


# Postgres's SQLSTATE for a deadlock; Citus reports a distributed deadlock (a cycle of waits
# over several nodes, "canceling the transaction since it was involved in a distributed
# deadlock") with it too.
_PG_DEADLOCK = "40P01"


def is_deadlock(error: BaseException) -> bool:
    """True when the server broke a deadlock by cancelling this transaction (Postgres, or a
    distributed deadlock that Citus found)."""
    return getattr(error, "sqlstate", None) == _PG_DEADLOCK


# SQLite's primary code for a write the file or connection does not allow.
_SQLITE_READONLY = 8
# Postgres's SQLSTATE for a write in a read-only transaction.
_PG_READ_ONLY_TRANSACTION = "25006"


def is_read_only_refusal(dialect: Dialect, error: BaseException) -> bool:
    """True when the database refused a write because the connection or file is read-only."""
    if dialect.name == "postgresql":
        return getattr(error, "sqlstate", None) == _PG_READ_ONLY_TRANSACTION
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, sqlite3.Error) and code is not None and code & 0xFF == _SQLITE_READONLY


# Postgres's SQLSTATEs for a missing privilege and for a statement the server cancelled
# (statement_timeout, or pg_cancel_backend).
_PG_INSUFFICIENT_PRIVILEGE = "42501"
_PG_QUERY_CANCELED = "57014"


def is_permission_denied(error: BaseException) -> bool:
    """True when the database role lacks a privilege the statement needs (Postgres)."""
    return getattr(error, "sqlstate", None) == _PG_INSUFFICIENT_PRIVILEGE


# Postgres's SQLSTATEs for a prepared statement that is not there or is there already, and
# for a protocol violation (a statement bound with another statement's parameters).
_PG_PREPARED_STATEMENT_STATES = {"26000", "42P05", "08P01"}


def is_pooler_refusal(error: BaseException | None) -> bool:
    """True when the server does not know (or already knows) a statement the driver had
    prepared on the connection: what a transaction-mode pooler does to prepared statements."""
    return getattr(
        error, "sqlstate", None
    ) in _PG_PREPARED_STATEMENT_STATES and "prepared statement" in str(error)


def is_statement_cancelled(error: BaseException) -> bool:
    """True when the server cancelled the statement: ``statement_timeout`` (Postgres)."""
    return getattr(error, "sqlstate", None) == _PG_QUERY_CANCELED


def is_connection_lost(
    dialect: Any, error: BaseException, dbapi_connection: Any, cursor: Any
) -> bool:
    """Whether ``error`` lost the connection: the dialect's list of messages, or a driver
    connection that reports itself closed or broken (psycopg says "connection socket
    closed" for a peer that went away before the statement was sent, which SQLAlchemy's
    list does not name)."""
    if dialect.is_disconnect(error, dbapi_connection, cursor):
        return True
    return bool(
        getattr(dbapi_connection, "broken", False) or getattr(dbapi_connection, "closed", False)
    )
