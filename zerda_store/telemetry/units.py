"""Units of work as child spans of the operation that runs them.

Only inside an observed operation (:data:`operations.current` set) does a unit of work
get a span and a ``db.client.operation.duration`` record; elsewhere each hook is one
context-variable read. The span is named ``{db.operation.name} {db.namespace}``, where the
operation is ``write``, ``read`` or ``snapshot read`` (a unit is a whole transaction, not a
statement), and carries its attempts; each retry is an event, a lock wait of a SQLite
write an attribute. :func:`carry` takes the caller's context (its span and operation) into
the database thread that runs an async call's unit of work.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from .operations import Operation, current

T = TypeVar("T")

# The unit of work running in this context, when observed.
_unit: contextvars.ContextVar[Unit | None] = contextvars.ContextVar(
    "zerda_store_unit", default=None
)


class Unit:
    """One observed unit of work: its span and how many attempts it took."""

    __slots__ = ("attempts", "lock_wait", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.attempts = 1
        self.lock_wait = 0.0


def outside_a_unit() -> bool:
    """Whether no observed unit of work is running in this context (a unit of work that
    runs another, as a read on the event loop falls back to a thread, is one span)."""
    return _unit.get() is None


def run(kind: str, call: Callable[..., T], *arguments: Any, **keywords: Any) -> T:
    """``call(*arguments, **keywords)`` as an observed unit of work of ``kind``."""
    operation = current.get()
    if operation is None:
        return call(*arguments, **keywords)
    with _observed_unit(operation, kind, on_loop=False):
        return call(*arguments, **keywords)


@contextmanager
def _observed_unit(operation: Operation, kind: str, *, on_loop: bool) -> Iterator[Unit]:
    span = None
    attached = None
    if operation.tracer is not None:
        from opentelemetry import context, trace

        system, namespace = (
            operation.attributes["db.system.name"],
            operation.attributes["db.namespace"],
        )
        span = operation.tracer.start_span(
            f"{kind} {namespace}",
            kind=trace.SpanKind.CLIENT,
            attributes=_unit_attributes(system, namespace, kind, on_loop),
        )
        attached = context.attach(trace.set_span_in_context(span))
    unit = Unit(span)
    token = _unit.set(unit)
    began = time.perf_counter()
    error_type = None
    try:
        yield unit
    except BaseException as exc:
        error_type = type(exc).__name__
        raise
    finally:
        duration = time.perf_counter() - began
        _unit.reset(token)
        _end(operation, unit, kind, duration, error_type, attached)


def _end(
    operation: Operation,
    unit: Unit,
    kind: str,
    duration: float,
    error_type: str | None,
    attached: Any,
) -> None:
    span = unit.span
    if span is not None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        if unit.attempts > 1:
            span.set_attribute("zerda_store.unit_of_work.attempts", unit.attempts)
        if unit.lock_wait:
            span.set_attribute("zerda_store.lock.wait.duration", unit.lock_wait)
        if error_type is not None:
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, error_type))
        span.end()
        context.detach(attached)
    instruments = operation.instruments
    if instruments is not None:
        attributes = {
            "db.system.name": operation.attributes["db.system.name"],
            "db.operation.name": kind,
            "db.namespace": operation.attributes["db.namespace"],
        }
        if error_type is not None:
            attributes["error.type"] = error_type
        instruments.unit_duration.record(duration, attributes)
        if unit.attempts > 1:
            instruments.unit_retries.add(unit.attempts - 1, attributes)
        if unit.lock_wait:
            instruments.lock_wait.record(unit.lock_wait, attributes)


def on_loop(kind: str) -> Any:
    """A context manager around a unit of work run on the event loop (Postgres reads and
    one-trip saves): observed inside an observed operation, else a shared no-op."""
    operation = current.get()
    if operation is None:
        return _NOTHING
    return _observed_unit(operation, kind, on_loop=True)


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


_NOTHING = _Nothing()


def retried(number: int, error: BaseException) -> None:
    """A unit of work failed its attempt ``number`` with ``error`` and runs again."""
    unit = _unit.get()
    if unit is None:
        return
    unit.attempts = number + 1
    if unit.span is not None:
        cause = getattr(error, "orig", None) or error
        unit.span.add_event(
            "zerda_store.unit_of_work.retry",
            {"zerda_store.unit_of_work.attempt": number, "error.type": type(cause).__name__},
        )


def waited_for_lock(seconds: float) -> None:
    """A write waited ``seconds`` for the database's write lock (SQLite's BEGIN IMMEDIATE)."""
    unit = _unit.get()
    if unit is not None:
        unit.lock_wait += seconds


def carry(run: Callable[[], T]) -> Callable[[], T]:
    """``run`` to be called on another thread in the caller's context (its span, its
    observed operation); ``run`` itself outside an observed operation."""
    if current.get() is None:
        return run
    context = contextvars.copy_context()
    return lambda: context.run(run)


def locking(begin: Callable[[str], Any], statement: str) -> None:
    """``begin(statement)``, a statement that waits for the database's write lock (SQLite's
    BEGIN IMMEDIATE); inside an observed unit of work, the wait is measured."""
    if _unit.get() is None:
        begin(statement)
        return
    began = time.perf_counter()
    begin(statement)
    waited_for_lock(time.perf_counter() - began)


@functools.lru_cache(maxsize=64)
def _unit_attributes(system: str, namespace: str, kind: str, on_loop: bool) -> dict[str, Any]:
    """A unit of work's span attributes at its start (shared: the SDK copies them)."""
    return {
        "db.system.name": system,
        "db.namespace": namespace,
        "db.operation.name": kind,
        "zerda_store.unit_of_work.attempts": 1,
        "zerda_store.unit_of_work.on_event_loop": on_loop,
    }
