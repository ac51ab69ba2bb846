"""psycopg's private names that the event loop's reads and writes drive, in one place.

psycopg's public calls run a statement or a pipeline and wait for its answer in one go, on
the calling thread. :mod:`aio.loop_reads` and :mod:`aio.loop_writes` need the steps apart:
a pipeline handed to the socket whole with no await (so its transaction never waits for a
busy loop), then only its answers awaited on the event loop. psycopg builds its own calls
from generators that say what to wait for on the socket; this module drives those
generators with psycopg's own waits, and nothing else in the package names them:

- ``Cursor._execute_gen(query, params)``: a statement sent (queued, in a pipeline);
- ``Pipeline(connection, _no_lock=True)``, set as the connection's ``_pipeline``: a pipeline
  that does not take the connection's lock (the loop never waits for a thread's lock);
- its ``_enter_gen()``, ``_enqueue_sync()``, ``_communicate_gen()``,
  ``_fetch_gen(flush=True)`` and ``_exit(exc)``: pipeline mode entered, the sync queued,
  what is queued sent, the answers read, pipeline mode left;
- ``psycopg.generators.send(pgconn)`` and ``psycopg.waiting.wait`` / ``wait_async``.

Tested on psycopg 3.3.9; ``tests/unit/test_psycopg_internals.py`` checks each of these
names and signatures, and drives them on a server, so a psycopg that changes them fails
there by name. A psycopg without them sends the reads and writes to a database thread
(:func:`executes_on_loop`, :func:`pipelines_on_loop`), as before the loop path existed.
"""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace
from typing import Any

# How often (seconds) a wait looks up from the socket, as psycopg's async connection does.
WAIT_INTERVAL = 0.1

# The pipeline's private methods driven here.
PIPELINE_METHODS = ("_enter_gen", "_enqueue_sync", "_communicate_gen", "_fetch_gen", "_exit")


@functools.cache
def executes_on_loop() -> bool:
    """Whether the installed psycopg has the cursor's execution generator driven by
    :func:`execute` (``Cursor.execute`` is that generator and a wait)."""
    from psycopg import Cursor

    return hasattr(Cursor, "_execute_gen")


@functools.cache
def pipelines_on_loop() -> bool:
    """Whether the installed psycopg has everything :class:`LoopPipeline` drives."""
    from psycopg import Pipeline, generators

    return (
        executes_on_loop()
        and hasattr(generators, "send")
        and all(hasattr(Pipeline, name) for name in PIPELINE_METHODS)
        and "_no_lock" in inspect.signature(Pipeline).parameters
    )


@functools.cache
def _psycopg() -> SimpleNamespace:
    """psycopg's pipeline, the generator that sends what libpq holds, and its waits:
    imported once, when first needed (psycopg is an optional dependency)."""
    from psycopg import Pipeline, generators, waiting

    return SimpleNamespace(
        Pipeline=Pipeline, send=generators.send, wait=waiting.wait, wait_async=waiting.wait_async
    )


async def execute(driver_connection: Any, cursor: Any, sql: str, parameters: Any) -> None:
    """Run ``sql`` on ``cursor`` (of ``driver_connection``), its waits on the socket
    awaited on the event loop; its rows are then on the cursor."""
    execution = cursor._execute_gen(sql, parameters)
    await _psycopg().wait_async(execution, driver_connection.pgconn.socket, interval=WAIT_INTERVAL)


class LoopPipeline:
    """One pipeline on a driver connection in autocommit, taking none of its locks: its
    statements and sync handed to the socket with blocking waits (:meth:`enter`,
    :meth:`queue`, :meth:`send_sync`: no await in between), its answers awaited on the
    event loop (:meth:`answers`), then left (:meth:`close`)."""

    def __init__(self, driver_connection: Any) -> None:
        self._connection = driver_connection
        self._socket = driver_connection.pgconn.socket
        pipeline = _psycopg().Pipeline(driver_connection, _no_lock=True)
        self._pipeline = driver_connection._pipeline = pipeline

    def enter(self) -> None:
        """Put the connection in pipeline mode."""
        self._wait(self._pipeline._enter_gen())

    def queue(self, cursor: Any, sql: str, parameters: Any) -> None:
        """Send ``sql`` on ``cursor`` as part of the pipeline (its answer comes later).
        Like :meth:`send_sync`, it reads the answers already come back, so it may raise
        the server's first error already."""
        self._wait(cursor._execute_gen(sql, parameters))

    def send_sync(self) -> None:
        """Queue the sync (the commit of the pipeline's implicit transaction) and hand
        everything queued to the socket, including what libpq still holds (a large turn:
        the socket took part of it). Only a socket whose buffer is full waits. May raise
        the server's first error, when its answer came back while sending."""
        self._pipeline._enqueue_sync()
        self._wait(self._pipeline._communicate_gen())
        self._wait(_psycopg().send(self._connection.pgconn))

    async def answers(self) -> None:
        """The statements' answers and the sync's, awaited on the event loop; the rows
        are then on the cursors. Raises the server's first error."""
        fetch = self._pipeline._fetch_gen(flush=True)
        await _psycopg().wait_async(fetch, self._socket, interval=WAIT_INTERVAL)

    def close(self, exc: BaseException | None) -> None:
        """Leave pipeline mode (after ``exc``, if it failed); the connection no longer
        holds the pipeline, even if leaving fails."""
        try:
            self._pipeline._exit(exc)
        finally:
            self._connection._pipeline = None

    def _wait(self, generator: Any) -> None:
        _psycopg().wait(generator, self._socket, interval=WAIT_INTERVAL)
