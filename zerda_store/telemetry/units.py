"""Units of work as child spans of the operation that runs them.

Only inside an observed operation (:data:`operations.current` set) is a unit of work
observed; elsewhere each hook is one context-variable read. An observed unit records
``db.client.operation.duration`` and, under a recording operation span, a span named
``{db.operation.name} {db.namespace}``, where the operation is ``write`` or ``read`` (a
unit is a whole transaction, not a statement). The span carries the unit's attempts,
the statements it sent and, on Postgres, its round trips (the times the client waited
for the server); each retry is an event, and the time a write waited for its lock an
attribute (SQLite: BEGIN IMMEDIATE; Postgres: the session's advisory lock, when it is a
statement of its own). With ``Telemetry(child_spans="failures")`` a unit that neither
failed nor ran again makes no span: its figures are summed on the operation's.
:func:`carry` takes the caller's context (its span and operation) into the database
thread that runs an async call's unit of work.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .operations import Operation, current, otel

T = TypeVar("T")

# The unit of work running in this context, when observed (read inline by the hot
# paths' hooks, so that outside an observed unit they cost one lookup and no call).
current_unit: contextvars.ContextVar[Unit | None] = contextvars.ContextVar(
    "zerda_store_unit", default=None
)
_unit = current_unit


class Unit:
    """One observed unit of work (a context manager around it): its span, attempts,
    statements, round trips and lock wait."""

    __slots__ = (
        "attached",
        "attempts",
        "began",
        "kind",
        "lock_wait",
        "on_loop",
        "operation",
        "retries",
        "round_trips",
        "span",
        "statements",
        "token",
    )

    def __init__(
        self, operation: Operation, kind: str, on_loop: bool, statements: int, round_trips: int
    ) -> None:
        self.operation = operation
        self.kind = kind
        self.on_loop = on_loop
        self.statements = statements
        self.round_trips = round_trips
        self.attempts = 1
        self.lock_wait = 0.0
        self.span: Any = None
        self.attached: Any = None
        # Retries seen without a span yet: (attempt, error.type, time in ns).
        self.retries: list[tuple[int, str, int]] | None = None

    def __enter__(self) -> Unit:
        operation = self.operation
        if operation.recording and operation.child_spans:
            api = otel()
            name, attributes = _unit_labels(
                operation.system, operation.namespace, self.kind, self.on_loop
            )
            self.span = operation.tracer.start_span(name, kind=api.CLIENT, attributes=attributes)
            self.attached = api.attach(api.in_context(self.span))
        self.token = _unit.set(self)
        self.began = time.perf_counter()
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        duration = time.perf_counter() - self.began
        _unit.reset(self.token)
        error_type = None if error is None else type(error).__name__
        operation = self.operation
        if self.span is not None:
            self._end_span(self.span, error_type)
            otel().detach(self.attached)
        elif operation.recording:
            if error_type is not None or self.attempts > 1:  # worth a span of its own
                self._end_span(self._span_after(duration), error_type)
            else:
                operation.units += 1
                operation.statements += self.statements
                operation.round_trips += self.round_trips
                operation.lock_wait += self.lock_wait
        if operation.instruments is not None:
            self._record(operation.instruments, duration, error_type)

    def _span_after(self, duration: float) -> Any:
        """The span of a unit that did not have one while it ran (``child_spans``
        "failures"), made now with the time it began, under the operation's span."""
        operation = self.operation
        api = otel()
        name, attributes = _unit_labels(
            operation.system, operation.namespace, self.kind, self.on_loop
        )
        span = operation.tracer.start_span(
            name,
            context=api.in_context(operation.span),
            kind=api.CLIENT,
            attributes=attributes,
            start_time=time.time_ns() - int(duration * 1e9),
        )
        for attempt, error_type, at in self.retries or ():
            span.add_event(_RETRY, _retry_attributes(attempt, error_type), timestamp=at)
        return span

    def _end_span(self, span: Any, error_type: str | None) -> None:
        if self.attempts > 1:
            span.set_attribute("zerda_store.unit_of_work.attempts", self.attempts)
        span.set_attribute("zerda_store.unit_of_work.statements", self.statements)
        if self.round_trips:
            span.set_attribute("zerda_store.unit_of_work.round_trips", self.round_trips)
        if self.lock_wait:
            span.set_attribute("zerda_store.lock.wait.duration", self.lock_wait)
        if error_type is not None:
            api = otel()
            span.set_attribute("error.type", error_type)
            span.set_status(api.Status(api.ERROR, error_type))
        span.end()

    def _record(self, instruments: Any, duration: float, error_type: str | None) -> None:
        operation = self.operation
        attributes = _metric_attributes(operation.system, self.kind, operation.namespace)
        if error_type is not None:
            attributes = {**attributes, "error.type": error_type}
        instruments.unit_duration.record(duration, attributes)
        if self.attempts > 1:
            instruments.unit_retries.add(self.attempts - 1, attributes)
        if self.lock_wait:
            instruments.lock_wait.record(self.lock_wait, attributes)
        if self.round_trips:
            instruments.round_trips.record(self.round_trips, attributes)


def outside_a_unit() -> bool:
    """Whether no observed unit of work is running in this context (a unit of work that
    runs another, as a read on the event loop falls back to a thread, is one span)."""
    return _unit.get() is None


def run(kind: str, call: Callable[..., T], *arguments: Any, **keywords: Any) -> T:
    """``call(*arguments, **keywords)`` as an observed unit of work of ``kind``."""
    operation = current.get()
    if operation is None:
        return call(*arguments, **keywords)
    with Unit(operation, kind, False, 0, 0):
        return call(*arguments, **keywords)


def on_loop(kind: str, statements: int, round_trips: int) -> Any:
    """A context manager around a unit of work run on the event loop (Postgres reads and
    one-trip saves), which sends ``statements`` in ``round_trips``: observed inside an
    observed operation, else a shared no-op."""
    operation = current.get()
    if operation is None:
        return _NOTHING
    return Unit(operation, kind, True, statements, round_trips)


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


_NOTHING = _Nothing()
_RETRY = "zerda_store.unit_of_work.retry"


def retried(number: int, error: BaseException) -> None:
    """A unit of work failed its attempt ``number`` with ``error`` and runs again."""
    unit = _unit.get()
    if unit is None:
        return
    unit.attempts = number + 1
    if not unit.operation.recording:
        return
    cause = getattr(error, "orig", None) or error
    if unit.span is not None:
        unit.span.add_event(_RETRY, _retry_attributes(number, type(cause).__name__))
        return
    if unit.retries is None:
        unit.retries = []
    unit.retries.append((number, type(cause).__name__, time.time_ns()))


def _retry_attributes(attempt: int, error_type: str) -> dict[str, Any]:
    return {"zerda_store.unit_of_work.attempt": attempt, "error.type": error_type}


def sent(statements: int, round_trips: int) -> None:
    """An attempt of the running unit of work sent ``statements`` in ``round_trips``
    (0 on SQLite, which has no server to wait for)."""
    unit = _unit.get()
    if unit is not None:
        unit.statements += statements
        unit.round_trips += round_trips


def carry(run: Callable[[], T]) -> Callable[[], T]:
    """``run`` to be called on another thread in the caller's context (its span, its
    observed operation); ``run`` itself outside an observed operation."""
    if current.get() is None:
        return run
    context = contextvars.copy_context()
    return lambda: context.run(run)


def locking(take: Callable[..., T], *arguments: Any) -> T:
    """``take(*arguments)``, a statement that waits for a lock (SQLite's BEGIN IMMEDIATE,
    Postgres's session advisory lock); inside an observed unit of work, the wait (with
    the statement's own round trip) is added to the unit's lock wait."""
    unit = _unit.get()
    if unit is None:
        return take(*arguments)
    began = time.perf_counter()
    try:
        return take(*arguments)
    finally:
        unit.lock_wait += time.perf_counter() - began


@functools.lru_cache(maxsize=64)
def _unit_labels(
    system: str, namespace: str, kind: str, on_loop: bool
) -> tuple[str, dict[str, Any]]:
    """A unit of work's span name and its attributes at its start (shared: the SDK
    copies them)."""
    return f"{kind} {namespace}", {
        "db.system.name": system,
        "db.namespace": namespace,
        "db.operation.name": kind,
        "zerda_store.unit_of_work.attempts": 1,
        "zerda_store.unit_of_work.on_event_loop": on_loop,
    }


@functools.lru_cache(maxsize=64)
def _metric_attributes(system: str, kind: str, namespace: str) -> dict[str, Any]:
    """A unit of work's metric attributes (shared: never changed)."""
    return {"db.system.name": system, "db.operation.name": kind, "db.namespace": namespace}
