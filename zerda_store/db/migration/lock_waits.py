"""Short lock waits for `db upgrade` on Postgres: a revision's steps that take a table's
exclusive lock (``ADD COLUMN``, a constraint added or dropped, ``SET NOT NULL``, the key
swap) run in transactions that wait at most ``EXCLUSIVE_LOCK_TIMEOUT_MS`` for it, and the
upgrade tries again after a pause when that runs out.

Why: a statement waiting for a table's exclusive lock makes every later read and write of
the table queue behind it. Behind a long transaction of the application, the upgrade's
request would keep the whole application waiting; with a short ``lock_timeout`` it gives
way, the queue drains, and it asks again later. The steps whose waits hold nobody up run
outside transactions, under the connection's long ``lock_timeout``
(``CREATE INDEX CONCURRENTLY``, ``VALIDATE CONSTRAINT``, the batched backfills and
re-keying). Every revision that runs so goes on where it stopped when run again, so a try
cut short by the timeout is rolled back and the revisions are run again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from ...errors import LockTimeoutError
from ..execution.failures import is_deadlock, is_lock_timeout

logger = logging.getLogger("zerda_store.migrate")

# How long a transactional step of a revision waits for a table's lock before it gives way.
EXCLUSIVE_LOCK_TIMEOUT_MS = 500
# The pauses, in seconds, before each new try (then it gives up): about three minutes.
RETRY_PAUSES: tuple[float, ...] = (0.5, 1, 2, 4, 8, 15, 30, 30, 30, 60)


@contextmanager
def short_lock_waits(connection: Connection) -> Iterator[None]:
    """Every transaction begun on ``connection`` meanwhile waits at most
    ``EXCLUSIVE_LOCK_TIMEOUT_MS`` for a lock (``SET LOCAL``: statements outside transactions,
    in autocommit, keep the connection's own ``lock_timeout``)."""

    def begun(begun_on: Connection) -> None:
        driver: Any = begun_on.connection.driver_connection
        if not driver.autocommit:
            driver.execute(f"SET LOCAL lock_timeout = {EXCLUSIVE_LOCK_TIMEOUT_MS}")

    event.listen(connection, "begin", begun)
    try:
        yield
    finally:
        event.remove(connection, "begin", begun)


def retrying_lock_timeouts(
    connection: Connection, run: Callable[[], None], where: Callable[[], str]
) -> None:
    """Call ``run`` again, after a pause, while it stops on a ``lock_timeout`` or is cancelled
    to break a deadlock (on Citus, a distributed one: its waits span several nodes); give up
    with :class:`LockTimeoutError` after ``RETRY_PAUSES``. ``where``: what was stopped (asked
    after the rollback), e.g. "db upgrade, the revision after 0005"."""
    for pause in (*RETRY_PAUSES, None):
        try:
            run()
            return
        except OperationalError as exc:
            why = _gave_way(connection, exc)
            if why is None:
                raise
            if connection.in_transaction():
                connection.rollback()
            if pause is None:
                raise LockTimeoutError(
                    f"{where()}: gave up after {len(RETRY_PAUSES) + 1} tries over "
                    f"{sum(RETRY_PAUSES):g} s: each waited {EXCLUSIVE_LOCK_TIMEOUT_MS} ms for a "
                    "table's lock that another transaction kept, or deadlocked with one (find "
                    "it in pg_locks / pg_stat_activity); what was done is kept: run it again"
                ) from None
            logger.warning("%s: %s; trying again in %g s", where(), why, pause)
            time.sleep(pause)


def _gave_way(connection: Connection, exc: OperationalError) -> str | None:
    """Why a step gave way and may run again (a lock wait ran out, or a deadlock was broken
    by cancelling it), or None for any other failure."""
    if exc.orig is None:
        return None
    if is_lock_timeout(connection.dialect, exc.orig):
        return (
            f"a table's lock was not free within {EXCLUSIVE_LOCK_TIMEOUT_MS} ms (another "
            "transaction holds it)"
        )
    if connection.dialect.name == "postgresql" and is_deadlock(exc.orig):
        return "it deadlocked with another transaction, which went on (the server chose it)"
    return None
