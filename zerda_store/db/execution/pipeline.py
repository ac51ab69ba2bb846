"""Postgres: statements sent as one pipeline, so that a write is one round trip.

The statements run in the implicit transaction of one pipeline sync (psycopg's pipeline
mode, on a connection in autocommit): the server runs them in order, each with its own
snapshot, and commits them together when it reaches the sync; an error in any of them rolls
all of them back. The client waits once, for the answer to the sync.

That answer is the commit's, so a connection lost while waiting for it leaves the outcome
unknown (:class:`CommitOutcomeUnknownError`, as a connection lost during a COMMIT does on the
general path). A kept connection that the server closed while it sat idle has said so
already (its socket holds the server's farewell, or its end): that is seen without a round
trip before anything is sent, and the pipeline goes on a fresh connection instead.
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from typing import Any

from ...telemetry import units
from .driver import Runnable, kept_cursor, named_rows
from .failures import retryable_write
from .unit_of_work import Database, driver_failure, return_connection, with_retries

_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE, without importing the driver here
# Kept connections found closed by the server before one is found open (after the first,
# the store drops them all, so the next comes from a fresh pool).
_LIVE_ATTEMPTS = 3


def write_pipelined(store: Database, steps: Sequence[tuple[Runnable, Any]]) -> list[Any]:
    """Run ``steps`` (statements and their values) as one transaction in one round trip;
    the named rows the last one returns. Run again whole after a deadlock or a
    serialization failure."""
    store.check_writable()
    return with_retries(store, retryable_write, _attempt, store, sent_steps(store, steps))


def sent_steps(
    store: Database, steps: Sequence[tuple[Runnable, Any]]
) -> list[tuple[Runnable, Any]]:
    """``steps`` with their parameters, as a pipeline sends them: first, for a store
    without prepared statements (behind a transaction-mode pooler), the statement that
    gives the pipeline's transaction the store's settings."""
    settings = store.transaction_settings
    if settings is not None:
        steps = [(settings, {}), *steps]
    return [(statement, statement.parameters(values)) for statement, values in steps]


def _open_connection(store: Database) -> Any:
    """A pooled connection whose server has not closed it while it sat idle."""
    for _ in range(_LIVE_ATTEMPTS):
        connection = store.borrow()
        if not closed_by_server(connection.dbapi_connection):
            return connection
        connection.invalidate()
        store.drop_connections()
    return store.borrow()


def closed_by_server(driver_connection: Any) -> bool:
    """An idle connection never has anything to read, unless the server has closed it
    (a terminated backend sends its reason, then the end of the stream)."""
    try:
        readable, _, _ = select.select([driver_connection.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def step_cursors(connection: Any, count: int) -> list[Any]:
    """A cursor for each of a pipeline's ``count`` steps: the last step's rows are read, on
    the connection's own cursor (:func:`driver.kept_cursor`); each other step gets one of
    its own, to close once the pipeline is answered."""
    others = [connection.dbapi_connection.cursor() for _ in range(count - 1)]
    return [*others, kept_cursor(connection)]


def _attempt(store: Database, steps: Sequence[tuple[Runnable, Any]]) -> list[Any]:
    dialect = store.engine.dialect
    connection = _open_connection(store)
    driver_connection = connection.dbapi_connection
    cursors: list[Any] = []
    clean = sending = False
    try:
        if driver_connection.info.transaction_status != _IDLE:
            driver_connection.rollback()  # never expected of a kept connection; cheap to undo
        driver_connection.autocommit = True
        sending = True
        with driver_connection.pipeline():
            try:
                cursors = step_cursors(connection, len(steps))
                for cursor, (statement, parameters) in zip(cursors, steps, strict=True):
                    dialect.do_execute(cursor, statement.sql, parameters, None)
            except BaseException:
                # Never let the pipeline's exit send the sync (which would commit what
                # was queued): without it the server rolls the statements back.
                driver_connection.pgconn.finish()
                raise
        rows = named_rows(dialect, steps[-1][0], cursors[-1])
        clean = True
        return rows
    except dialect.loaded_dbapi.Error as orig:
        last_cursor = cursors[-1] if cursors else None
        # Once the pipeline is on its way, its answer is the commit's.
        raise driver_failure(store, connection, orig, last_cursor, committing=sending) from orig
    finally:
        if sending and units.current_unit.get() is not None:  # observed
            units.sent(len(steps), 1)  # the pipeline's one wait, for its sync
        for cursor in cursors[:-1]:
            cursor.close()
        return_connection(store, connection, cursors[-1] if cursors else None, True, clean)
