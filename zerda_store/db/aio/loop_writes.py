"""Postgres: a write of one pipeline sent from the event loop, with no database thread.

The async save of a turn that fits one round trip (:mod:`execution.pipeline`: the session's
lock and one statement, committed together at the pipeline's sync) is sent as
:mod:`aio.loop_reads` sends a read: on a connection an earlier unit of work left idle
(waiting on the loop for one given back, :mod:`connections.idle`), with psycopg's own
pipeline (:mod:`aio.psycopg_internals`). Without one it goes to a thread, as before.

It keeps the thread path's rules:

- The statements and the sync are handed to the socket together, with no await between
  them: the transaction never waits for the event loop, however busy it is, and the server
  commits it alone. Only the answers are awaited on the loop.
- Once the sync is sent, its answer is the commit's. The wait for it runs to its end in a
  task of its own; a caller cancelled meanwhile waits for it, then gets
  :class:`CancelledAfterCommitError` if the write is stored, else the cancellation.
- An error the server reports rolled everything back, and the connection is dropped. One
  worth another attempt (a deadlock, a serialization failure) leaves the write to a
  thread, whose unit of work has the retries; any other is raised as the thread path
  words it (a lock timeout waited once, not twice). A connection lost once anything was
  sent leaves the outcome unknown (:class:`CommitOutcomeUnknownError`), as on a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import CommitOutcomeUnknownError
from ...telemetry import units
from ..execution.driver import Runnable, named_rows
from ..execution.failures import failure, retryable_write
from ..execution.pipeline import closed_by_server, sent_steps, step_cursors
from ..execution.unit_of_work import driver_failure, return_connection
from .psycopg_internals import LoopPipeline, pipelines_on_loop
from .unit_of_work import AsyncDatabase, cancelled_after_commit


class NotSent:
    """What :func:`write` returns when it sent nothing from the loop (no idle connection,
    one the server closed), or when the server reported an error worth another attempt (a
    deadlock, a serialization failure: everything rolled back): nothing is stored, and
    the caller runs the write on a thread."""


NOT_SENT = NotSent()


async def write(
    store: AsyncDatabase,
    steps: Sequence[tuple[Runnable, Any]],
    stored: Callable[[list[Any]], bool],
) -> list[Any] | NotSent:
    """The rows the last of ``steps`` returns, the steps sent as one pipeline from the
    event loop (see the module); :data:`NOT_SENT` if they were not. ``stored`` tells from
    those rows whether the write stored anything (for a caller cancelled meanwhile)."""
    if not pipelines_on_loop():
        return NOT_SENT
    prepared = sent_steps(store, steps)
    connection = await store.borrow_on_loop()
    if connection is None:
        return NOT_SENT
    if closed_by_server(connection.dbapi_connection):
        connection.invalidate()
        store.give_back(connection, reusable=False)
        return NOT_SENT
    with units.on_loop("write", len(prepared), 1):  # one wait, for the pipeline's sync
        return await _sent(_Sending(store, connection, prepared), stored)


async def _sent(sending: _Sending, stored: Callable[[list[Any]], bool]) -> list[Any] | NotSent:
    """The pipeline sent whole, then its answer awaited (see :func:`write`)."""
    try:
        sending.send_whole()  # no await before the sync is sent: nothing to cancel
    except BaseException as exc:
        return sending.failed(exc)
    # From here the answer is the commit's: the wait for it runs to its end in a task of
    # its own, which no cancellation of the caller stops.
    answered = asyncio.ensure_future(sending.answers())
    try:
        return await asyncio.shield(answered)
    except asyncio.CancelledError as cancelled:
        try:
            rows = await _outcome(answered)
        except CommitOutcomeUnknownError:
            raise
        except Exception:  # it failed: rolled back
            raise cancelled from None
        if not isinstance(rows, NotSent) and stored(rows):
            raise cancelled_after_commit() from None
        raise


async def _outcome(answered: asyncio.Future[Any]) -> Any:
    """What ``answered`` gives, waited for through every further cancellation."""
    while not answered.done():
        try:
            await asyncio.shield(answered)
        except asyncio.CancelledError:
            continue
        except Exception:
            break
    return answered.result()


class _Sending:
    """One pipeline on one borrowed connection, from its sending to its answers."""

    def __init__(
        self, store: AsyncDatabase, connection: Any, steps: Sequence[tuple[Runnable, Any]]
    ) -> None:
        self.store = store
        self.connection = connection
        self.steps = steps
        self.cursors: list[Any] = []
        self.pipeline: LoopPipeline | None = None

    def send_whole(self) -> None:
        """Queue the steps and the sync and hand them all to the socket, with no await:
        however busy the event loop, the server gets the transaction whole and commits it
        alone. Only a socket whose buffer is full waits (here, as a sync write would)."""
        driver_connection = self.connection.dbapi_connection
        driver_connection.autocommit = True
        self.pipeline = pipeline = LoopPipeline(driver_connection)
        pipeline.enter()
        self.cursors = step_cursors(self.connection, len(self.steps))
        for cursor, (statement, parameters) in zip(self.cursors, self.steps, strict=True):
            pipeline.queue(cursor, statement.sql, parameters)
        pipeline.send_sync()

    async def answers(self) -> list[Any] | NotSent:
        """The statements' answers, the sync's last (the commit's), awaited on the loop."""
        try:
            assert self.pipeline is not None  # sent whole
            await self.pipeline.answers()
        except BaseException as exc:
            return self.failed(exc)
        clean = True
        try:
            self._close(None)
        except Exception:  # committed all the same (the sync's answer came)
            self.connection.invalidate()
            clean = False
        try:
            return named_rows(self.store.engine.dialect, self.steps[-1][0], self.cursors[-1])
        finally:
            self._give_back(clean=clean)

    def failed(self, exc: BaseException) -> NotSent:
        """After ``exc``: an error the server reported rolled the pipeline back; one worth
        another attempt (a deadlock, a serialization failure) leaves the write to the
        thread path, any other is raised as the thread path words it. A connection lost
        once anything was sent leaves the outcome unknown (:class:`CommitOutcomeUnknownError`).
        Anything else goes through."""
        connection = self.connection
        try:
            self._close(exc)
            dialect = self.store.engine.dialect
            if not isinstance(exc, dialect.loaded_dbapi.Error):
                raise exc
            last = self.cursors[-1] if self.cursors else None
            error = driver_failure(self.store, connection, exc, last, committing=True)
            raised = failure(self.store, error, 1, retryable_write)
            if raised is not None:
                raise raised from raised.__cause__
            return NOT_SENT
        finally:
            if connection.is_valid:
                connection.invalidate()
            self._give_back(clean=False)

    def _close(self, exc: BaseException | None) -> None:
        pipeline, self.pipeline = self.pipeline, None
        if pipeline is not None:
            pipeline.close(exc)

    def _give_back(self, *, clean: bool) -> None:
        for cursor in self.cursors[:-1]:  # the last is the connection's own
            cursor.close()
        return_connection(self.store, self.connection, None, True, clean)
