"""The metric instruments, made once per meter provider (imported only when one is
configured, so OpenTelemetry is imported only then).

Names and units follow the OpenTelemetry conventions where one fits (GenAI client and
database client metrics); the rest are ``zerda_store.*``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from .labels import INSTRUMENTATION_NAME, INSTRUMENTATION_VERSION, SCHEMA_URL, pool_name

# Bucket boundaries (seconds) for calls that take from tens of microseconds to seconds:
# the conventions' advice for gen_ai.client.operation.duration, with finer low buckets.
DURATION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
COUNT_BUCKETS = (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 100)


class Instruments:
    """Every instrument zerda_store records, on one meter."""

    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter(
            INSTRUMENTATION_NAME, INSTRUMENTATION_VERSION, schema_url=SCHEMA_URL
        )
        self.operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Duration of zerda_store memory operations",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.unit_duration = meter.create_histogram(
            "db.client.operation.duration",
            unit="s",
            description="Duration of zerda_store units of work (one transaction or read, "
            "with its retries)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.unit_retries = meter.create_counter(
            "zerda_store.unit_of_work.retries",
            unit="{retry}",
            description="Units of work run again after a deadlock, a serialization "
            "failure or a lost connection",
        )
        self.lock_timeouts = meter.create_counter(
            "zerda_store.lock.timeouts",
            unit="{timeout}",
            description="Operations that failed waiting for a lock (LockTimeoutError)",
        )
        self.lock_wait = meter.create_histogram(
            "zerda_store.lock.wait.duration",
            unit="s",
            description="Time a write waited for its lock (SQLite: BEGIN IMMEDIATE, the "
            "database's write lock; Postgres: the session's advisory lock, when taken by "
            "a statement of its own), with that statement's round trip",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.round_trips = meter.create_histogram(
            "zerda_store.unit_of_work.round_trips",
            unit="{round_trip}",
            description="Times a Postgres unit of work waited for the server (a "
            "statement, BEGIN, COMMIT, or a pipeline's sync), its retries included",
            explicit_bucket_boundaries_advisory=COUNT_BUCKETS,
        )
        self.extraction_duration = meter.create_histogram(
            "zerda_store.extraction.duration",
            unit="s",
            description="Duration of entity extraction (the LLM or stanza call)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.extraction_failures = meter.create_counter(
            "zerda_store.extraction.failures",
            unit="{failure}",
            description="Extractions that failed (the turn is stored without entities)",
        )
        self.recalled_entities = meter.create_histogram(
            "zerda_store.recall.entities",
            unit="{entity}",
            description="Entities recalled per load_memory_variables call",
            explicit_bucket_boundaries_advisory=COUNT_BUCKETS,
        )
        self.recalled_snippets = meter.create_histogram(
            "zerda_store.recall.snippets",
            unit="{snippet}",
            description="Snippets recalled per load_memory_variables call",
            explicit_bucket_boundaries_advisory=COUNT_BUCKETS,
        )
        self.connection_timeouts = meter.create_counter(
            "db.client.connection.timeouts",
            unit="{timeout}",
            description="Calls that found no pooled connection (or async database "
            "thread) free within pool_timeout (PoolExhaustedError)",
        )
        self.pruned = meter.create_counter(
            "zerda_store.retention.pruned",
            unit="{row}",
            description="Rows deleted by retention (prune and the sweeper), by kind",
        )
        self._stores: weakref.WeakSet[Any] = weakref.WeakSet()
        self._backlog: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()
        meter.create_observable_up_down_counter(
            "db.client.connection.count",
            callbacks=[self._connections],
            unit="{connection}",
            description="Connections of each store's pool, by state (idle, used)",
        )
        meter.create_observable_up_down_counter(
            "db.client.connection.pending_requests",
            callbacks=[self._pending],
            unit="{request}",
            description="Async units of work waiting for a free database thread",
        )
        meter.create_observable_gauge(
            "zerda_store.retention.backlog",
            callbacks=[self._backlog_rows],
            unit="{row}",
            description="Expired rows not yet deleted, as the last prune or dry run of "
            "each session found them (no query is made to report it)",
        )

    def watch(self, store: Any) -> None:
        """Report ``store``'s pool in the observable instruments (held weakly)."""
        if store not in self._stores:
            with self._lock:
                self._stores.add(store)

    def note_backlog(self, store: Any, session: str, rows: int) -> None:
        """Expired rows of one session not yet deleted (0 after a prune of it)."""
        key = (id(store), session)
        with self._lock:
            if rows:
                self._backlog[key] = rows
            else:
                self._backlog.pop(key, None)

    def _connections(self, options: CallbackOptions) -> Iterable[Observation]:
        for store in list(self._stores):
            state = pool_state(store)
            if state is None:
                continue
            name, idle, used = state
            yield Observation(idle, {"db.client.connection.state": "idle",
                                     "db.client.connection.pool.name": name})  # fmt: skip
            yield Observation(used, {"db.client.connection.state": "used",
                                     "db.client.connection.pool.name": name})  # fmt: skip

    def _pending(self, options: CallbackOptions) -> Iterable[Observation]:
        for store in list(self._stores):
            waiting = pending_units(store)
            if waiting is not None:
                yield Observation(waiting, {"db.client.connection.pool.name": pool_name(store)})

    def _backlog_rows(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            total = sum(self._backlog.values())
        yield Observation(total)


def pool_state(store: Any) -> tuple[str, int, int] | None:
    """(name, idle, used) of a store's pool, read from SQLAlchemy's pool counters (no
    query); None for a closed store or a pool without counters."""
    if getattr(store, "closed", False):
        return None
    pool = store.engine.pool
    try:
        checked_out = int(pool.checkedout())
        idle_in_pool = int(pool.checkedin())
    except AttributeError:
        return None
    used = int(store.connections_in_use())
    kept = checked_out - used
    return pool_name(store), idle_in_pool + kept, used


def pending_units(store: Any) -> int | None:
    """How many async units of work wait for a database thread (None: a store that
    cannot tell)."""
    waiting = getattr(store, "units_waiting", None)
    return None if waiting is None else int(waiting())
