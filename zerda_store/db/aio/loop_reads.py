"""Postgres: a read of one statement sent from the event loop, with no database thread.

A hand-off to a database thread and back is two thread wake-ups: on a 2-core machine about
220 µs of CPU and 330 µs of wall time, against about 12 µs for a read's own unit of work
(``benchmarks/async_cpu.py``). A read of one statement that needs no transaction around
it (a turn's recall, its idempotency key's check: :class:`unit_of_work.OneStatement`) is
sent from the event loop instead, on a connection an earlier unit of work left idle:
psycopg's own execution of the statement, its waits awaited on the loop
(:mod:`aio.psycopg_internals`), so the loop serves other requests while the server
answers. The loop never waits for anything but the socket and a kept connection given
back by another of its round trips (:mod:`connections.idle`): with none (the pool's checkout may open
one) the read goes to a thread as before.

The read runs in autocommit, as the general path's single-statement read does. A driver
error drops the connection and runs the read again on a thread, whose unit of work has
the retries and the errors' wording; a cancellation drops the connection (a statement may
be on its way) and goes through.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ...telemetry import units
from ..execution.driver import Runnable, kept_cursor, named_rows
from ..execution.pipeline import closed_by_server
from ..execution.unit_of_work import OneStatement
from .psycopg_internals import execute, executes_on_loop
from .unit_of_work import AsyncDatabase

T = TypeVar("T")


async def read(store: AsyncDatabase, work: OneStatement[T]) -> T:
    """``work``'s answer, read from the event loop (see the module), else on a thread."""
    statement = work.statement
    if statement is None:
        return work.then([])
    if store.reads_need_settings:  # in a transaction, on a thread
        return await store.aread(work)
    connection = await store.borrow_on_loop() if executes_on_loop() else None
    if connection is None:
        return await store.aread(work)
    with units.on_loop("read", 1, 1):
        return await _read_on_loop(store, work, connection, statement)


async def _read_on_loop(
    store: AsyncDatabase, work: OneStatement[T], connection: Any, statement: Any
) -> T:
    driver_connection = connection.dbapi_connection
    dialect = store.engine.dialect
    rows: list[Any] | None = None
    try:
        if closed_by_server(driver_connection):
            connection.invalidate()
        else:
            rows = await _rows(connection, dialect, statement, work.values)
    except dialect.loaded_dbapi.Error as exc:
        connection.invalidate(exc)
    except BaseException:
        connection.invalidate()
        raise
    finally:
        store.give_back(connection, reusable=rows is not None)
    if rows is None:
        return await store.aread(work)
    return work.then(rows)


async def _rows(connection: Any, dialect: Any, statement: Runnable, values: Any) -> list[Any]:
    driver_connection = connection.dbapi_connection
    driver_connection.autocommit = True
    cursor = kept_cursor(connection)
    await execute(driver_connection, cursor, statement.sql, statement.parameters(values))
    rows = named_rows(dialect, statement, cursor)
    driver_connection.autocommit = False
    return rows
