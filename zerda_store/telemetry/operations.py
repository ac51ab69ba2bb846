"""Public operations as spans, metrics and log lines.

:func:`observed` wraps a method of the memory, the pruner, the admin repository or the
transfer code: when nothing listens (no tracer provider, no meter provider, the
``zerda_store.operations`` logger not at DEBUG) it calls the method after three cheap
checks; otherwise it opens a span named by the GenAI memory conventions
(``{gen_ai.operation.name} {gen_ai.memory.store.id}``), records the duration histogram,
and logs one line. The running :class:`Operation` is held in a context variable, so the
units of work and the extraction below it find their tracer and instruments without
being handed them (and do nothing outside an observed operation).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from .labels import system_of
from .settings import Telemetry, default_telemetry

logger = logging.getLogger("zerda_store.operations")
DEBUG = logging.DEBUG
INFO = logging.INFO

F = TypeVar("F", bound=Callable[..., Any])

# The operation running in this context (task or thread), when it is observed.
current: ContextVar[Operation | None] = ContextVar("zerda_store_operation", default=None)

# gen_ai.operation.name values of the GenAI memory conventions.
SEARCH = "search_memory"
UPDATE = "update_memory"
DELETE = "delete_memory"
CREATE_STORE = "create_memory_store"
DELETE_STORE = "delete_memory_store"


def telemetry_of(store: Any) -> Telemetry:
    """The store's telemetry settings (the default ones for a store without any, such
    as a unit test's fake)."""
    return getattr(store, "telemetry", None) or default_telemetry()


class Api:
    """The OpenTelemetry API's names that every observed call uses, looked up once (an
    ``import`` statement in a function costs more than the attribute reads it saves)."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode

        self.attach = context.attach
        self.detach = context.detach
        self.in_context = trace.set_span_in_context
        self.CLIENT = trace.SpanKind.CLIENT
        self.INTERNAL = trace.SpanKind.INTERNAL
        self.Status = Status
        self.ERROR = StatusCode.ERROR


_api: Api | None = None


def otel() -> Api:
    """:class:`Api`, made on first use (only once a tracer exists, so OpenTelemetry is
    imported only then)."""
    global _api
    if _api is None:
        _api = Api()
    return _api


class Operation:
    """One observed public operation: its span (None without a tracer), its instruments
    (None without a meter), and the attributes its children repeat.

    ``recording`` is False when there is no span or the sampler dropped it: then no child
    span is made and no attribute built. ``child_spans`` (``Telemetry(child_spans=...)``)
    False: the units of work and the extraction fold their figures into this span
    (``units``, ``statements``, ``round_trips``, ``lock_wait``), and only one that failed
    or retried gets a span of its own."""

    __slots__ = (
        "attributes",
        "child_spans",
        "content",
        "instruments",
        "lock_wait",
        "metric_attributes",
        "name",
        "namespace",
        "recording",
        "round_trips",
        "session",
        "span",
        "span_name",
        "statements",
        "store",
        "system",
        "telemetry",
        "tracer",
        "units",
    )

    def __init__(
        self,
        store: Any,
        telemetry: Telemetry,
        tracer: Any,
        instruments: Any,
        name: str,
        gen_ai_operation: str,
        session_id: str | None,
    ) -> None:
        self.store = store
        self.telemetry = telemetry
        self.tracer = tracer
        self.instruments = instruments
        self.name = name
        self.content = telemetry.record_content
        self.child_spans = telemetry.child_spans == "all"
        self.session = telemetry.session_label(session_id)
        labels = telemetry.operation_labels(store, name, gen_ai_operation)
        self.system, self.namespace, self.span_name, self.metric_attributes, attributes = labels
        if self.session is not None:
            attributes = {**attributes, "gen_ai.conversation.id": self.session}
        self.attributes: dict[str, Any] = attributes
        self.span: Any = None
        self.recording = False
        self.units = self.statements = self.round_trips = 0
        self.lock_wait = 0.0
        if instruments is not None:
            instruments.watch(store)

    def set(self, key: str, value: Any) -> None:
        """Set an attribute on the operation's span (if it records)."""
        if self.recording:
            self.span.set_attribute(key, value)

    def set_content(self, key: str, value: Any) -> None:
        """Set a content attribute, only when the user opted in to content."""
        if self.content and self.recording:
            self.span.set_attribute(key, value)

    def set_folded(self) -> None:
        """The figures of the units of work folded into this span (``child_spans``
        "failures")."""
        span = self.span
        if self.units:
            span.set_attribute("zerda_store.unit_of_work.count", self.units)
            span.set_attribute("zerda_store.unit_of_work.statements", self.statements)
            if self.round_trips:
                span.set_attribute("zerda_store.unit_of_work.round_trips", self.round_trips)
        if self.lock_wait:
            span.set_attribute("zerda_store.lock.wait.duration", self.lock_wait)


def observed(
    gen_ai_operation: str,
    name: str | None = None,
    *,
    session: Callable[..., str | None] | None = None,
    store: Callable[[Any], Any] | None = None,
    done: Callable[[Operation, Any], None] | None = None,
) -> Callable[[F], F]:
    """Observe a method as the public operation ``name`` (the method's name by default)
    of kind ``gen_ai_operation``. ``store`` finds the store from the instance (its
    ``store`` attribute by default); ``session`` the session id from the call's
    arguments (the instance's ``session_id`` by default); ``done`` reads the result
    into the span and metrics."""

    def decorate(method: F) -> F:
        label = name or method.__name__
        find_session = session or _session_attribute

        def start(
            self: Any, target: Any, telemetry: Telemetry, args: tuple[Any, ...], kwargs: Any
        ) -> Operation | None:
            outer = current.get()
            if outer is not None and outer.name == label and outer.store is target:
                return None  # the same operation, called through a second layer
            tracer = telemetry.tracer()
            instruments = telemetry.instruments()
            if tracer is None and instruments is None and not logger.isEnabledFor(DEBUG):
                return None
            return Operation(
                target,
                telemetry,
                tracer,
                instruments,
                label,
                gen_ai_operation,
                find_session(self, *args, **kwargs),
            )

        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def awrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                target = self.store if store is None else store(self)
                operation = None
                telemetry = getattr(target, "telemetry", None) or default_telemetry()
                if not telemetry.quiet():
                    operation = start(self, target, telemetry, args, kwargs)
                if operation is None:
                    try:
                        return await method(self, *args, **kwargs)
                    except BaseException as exc:
                        _failed_quietly(label, exc)
                        raise
                began, token, attached = _enter(operation)
                try:
                    result = await method(self, *args, **kwargs)
                except BaseException as exc:
                    _exit(operation, began, token, attached, exc)
                    raise
                if done is not None:
                    done(operation, result)
                _exit(operation, began, token, attached, None)
                return result

            return cast(F, awrapper)

        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            target = self.store if store is None else store(self)
            operation = None
            telemetry = getattr(target, "telemetry", None) or default_telemetry()
            if not telemetry.quiet():
                operation = start(self, target, telemetry, args, kwargs)
            if operation is None:
                try:
                    return method(self, *args, **kwargs)
                except BaseException as exc:
                    _failed_quietly(label, exc)
                    raise
            began, token, attached = _enter(operation)
            try:
                result = method(self, *args, **kwargs)
            except BaseException as exc:
                _exit(operation, began, token, attached, exc)
                raise
            if done is not None:
                done(operation, result)
            _exit(operation, began, token, attached, None)
            return result

        return cast(F, wrapper)

    return decorate


def _session_attribute(instance: Any, *_: Any, **__: Any) -> str | None:
    return getattr(instance, "session_id", None)


def _enter(operation: Operation) -> tuple[float, Any, Any]:
    attached = None
    if operation.tracer is not None:
        api = otel()
        span = operation.tracer.start_span(
            operation.span_name, kind=api.CLIENT, attributes=operation.attributes
        )
        operation.span = span
        operation.recording = span.is_recording()
        # Made current even when not recording: what runs below (an LLM client's own
        # instrumentation) then sees the sampler's decision and follows it.
        attached = api.attach(api.in_context(span))
    token = current.set(operation)
    return time.perf_counter(), token, attached


def _exit(
    operation: Operation, began: float, token: Any, attached: Any, error: BaseException | None
) -> None:
    current.reset(token)
    _finish(operation, began, error)
    if attached is not None:
        otel().detach(attached)


def _finish(operation: Operation, began: float, error: BaseException | None) -> None:
    """End the operation's span, record its duration, log its line."""
    duration = time.perf_counter() - began
    error_type = None if error is None else type(error).__name__
    span = operation.span
    if span is not None:
        if operation.recording:
            if not operation.child_spans:
                operation.set_folded()
            if error_type is not None:
                api = otel()
                span.set_attribute("error.type", error_type)
                span.set_status(api.Status(api.ERROR, error_type))
        span.end()
    instruments = operation.instruments
    if instruments is not None:
        attributes = operation.metric_attributes
        if error_type is not None:
            attributes = {**attributes, "error.type": error_type}
            if error_type == "PoolExhaustedError":
                instruments.connection_timeouts.add(1, operation.metric_attributes)
            elif error_type == "LockTimeoutError":
                instruments.lock_timeouts.add(1, operation.metric_attributes)
        instruments.operation_duration.record(duration, attributes)
    _log(operation, duration, error_type)


def _log(operation: Operation, duration: float, error_type: str | None) -> None:
    level = DEBUG if error_type is None else INFO
    if logger.isEnabledFor(level):
        logger.log(
            level,
            "zerda_store.operation operation=%s session=%s outcome=%s duration_ms=%.3f%s",
            operation.name,
            operation.session,
            "ok" if error_type is None else "error",
            duration * 1000,
            "" if error_type is None else f" error.type={error_type}",
            extra={
                "event.name": "zerda_store.operation",
                "zerda_store.operation": operation.name,
                "zerda_store.session": operation.session,
                "zerda_store.outcome": "ok" if error_type is None else "error",
                "zerda_store.duration_s": duration,
                "error.type": error_type,
            },
        )


def _failed_quietly(name: str, error: BaseException) -> None:
    """A failed operation that nothing observes: one INFO line, no session, no text."""
    if logger.isEnabledFor(INFO):
        error_type = type(error).__name__
        logger.info(
            "zerda_store.operation operation=%s outcome=error error.type=%s",
            name,
            error_type,
            extra={
                "event.name": "zerda_store.operation",
                "zerda_store.operation": name,
                "zerda_store.outcome": "error",
                "error.type": error_type,
            },
        )


def note_recall(recalled: list[tuple[str, list[str]]], query: str) -> None:
    """Inside an observed recall: how many entities and snippets it found (and, opted in,
    the query and what it found)."""
    operation = current.get()
    if operation is None or (not operation.recording and operation.instruments is None):
        return
    operation.set_content("gen_ai.memory.query.text", query)
    entities = sum(1 for _, snippets in recalled if snippets)
    snippets = sum(len(snippets) for _, snippets in recalled)
    operation.set("gen_ai.memory.record.count", snippets)
    operation.set("zerda_store.recall.entities", entities)
    if operation.content:
        import json

        operation.set_content(
            "gen_ai.memory.records",
            json.dumps([{"name": name, "snippets": s} for name, s in recalled if s]),
        )
    instruments = operation.instruments
    if instruments is not None:
        instruments.recalled_entities.record(entities, operation.metric_attributes)
        instruments.recalled_snippets.record(snippets, operation.metric_attributes)


def note_content(key: str, value: str) -> None:
    """Inside an observed operation: a content attribute (a query, a turn's text),
    recorded only when the user opted in."""
    operation = current.get()
    if operation is not None and operation.content:
        operation.set_content(key, value)


def counts(operation: Operation, result: Any) -> None:
    """A ``done`` hook: the counts a call returns (a dict, or a receipt with
    ``as_dict()``) as ``zerda_store.result.<key>`` attributes."""
    if not operation.recording:
        return
    if hasattr(result, "as_dict"):
        values = result.as_dict()
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        values = dataclasses.asdict(result)
    else:
        values = result
    if not isinstance(values, dict):
        return
    for key, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool):
            operation.span.set_attribute(f"zerda_store.result.{key}", value)


def note_count(records: int) -> None:
    """Inside an observed operation: how many memory records (snippets) it touched."""
    operation = current.get()
    if operation is not None:
        operation.set("gen_ai.memory.record.count", records)


def note_pruned(store: Any, session_id: str, receipt: Any, *, dry_run: bool) -> None:
    """After a prune of one session (or its dry run): rows deleted by kind, and what is
    left of the session's retention backlog (nothing after a prune, the count after a dry
    run). Inside an observed operation only."""
    operation = current.get()
    if operation is None or operation.instruments is None:
        return
    instruments = operation.instruments
    values = receipt.as_dict()
    session = operation.telemetry.session_label(session_id) or ""
    rows = values.get("turns", 0) + values.get("snippets", 0) + values.get("entities", 0)
    instruments.note_backlog(store, session, rows if dry_run else 0)
    if dry_run:
        return
    for kind in ("turns", "snippets", "entities"):
        if values.get(kind):
            instruments.pruned.add(
                values[kind],
                {"zerda_store.retention.kind": kind, "db.system.name": system_of(store)},
            )


def session_argument(_instance: Any, session_id: str | None = None, *_: Any, **__: Any) -> Any:
    """A ``session`` finder: the call's first argument (or ``session_id=``)."""
    return session_id if isinstance(session_id, str) else __.get("session_id")


def note_saved(input_text: str, output_text: str, mentions: Sequence[Any]) -> None:
    """Inside an observed save: how many entities the turn names, and (opted in only)
    the turn's texts and names as ``gen_ai.memory.records``."""
    operation = current.get()
    if operation is None or not operation.recording:
        return
    operation.set("gen_ai.memory.record.count", len(mentions))
    if operation.content:
        import json

        operation.set_content(
            "gen_ai.memory.records",
            json.dumps(
                {
                    "input": input_text,
                    "output": output_text,
                    "entities": [mention.name for mention in mentions],
                }
            ),
        )


def observed_records(
    store: Any, name: str, session_id: str | None, records: Iterator[Any]
) -> Iterator[Any]:
    """``records`` (a lazy export) observed as the operation ``name`` from its first
    record to its last: a ``search_memory`` span with the count, ended when the
    iteration ends. Its context is not made current (a generator may be resumed
    anywhere), so the reads it makes do not nest under it."""
    telemetry = telemetry_of(store)
    tracer = telemetry.tracer()
    instruments = telemetry.instruments()
    if tracer is None and instruments is None and not logger.isEnabledFor(DEBUG):
        yield from records
        return
    operation = Operation(store, telemetry, tracer, instruments, name, SEARCH, session_id)
    if tracer is not None:
        operation.span = tracer.start_span(
            operation.span_name, kind=otel().CLIENT, attributes=operation.attributes
        )
        operation.recording = operation.span.is_recording()
    began = time.perf_counter()
    count = 0
    error: BaseException | None = None
    try:
        for record in records:
            count += 1
            yield record
    except BaseException as exc:
        error = exc
        raise
    finally:
        operation.set("gen_ai.memory.record.count", count)
        _finish(operation, began, error)
