"""Extraction (the LLM or stanza call) as a child span of the operation that asked for
it, with its latency and outcome in metrics. Outside an observed operation it is the
plain call. With ``Telemetry(child_spans="failures")`` only a failed extraction gets a
span (made when it ends); an extraction that worked puts its duration on the operation's
span. The extraction module hands results in; it imports no storage."""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from .operations import Operation, current, otel

T = TypeVar("T")
INTERNAL_SPAN = "extract_entities"


class Extracted(Protocol):
    """What an extraction returns, as far as telemetry reads it."""

    @property
    def status(self) -> str: ...

    @property
    def error(self) -> str | None: ...

    @property
    def entities(self) -> Any: ...


R = TypeVar("R", bound=Extracted)


# Set while an observed extraction runs (its call, run again inside the span, is plain).
_extracting: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "zerda_store_extracting", default=False
)


def outside() -> bool:
    """Whether no observed extraction is running in this context."""
    return not _extracting.get()


def observed(extractor: str, call: Callable[..., R], *arguments: Any) -> R:
    """``call(*arguments)`` (an extraction by ``extractor``), observed inside an
    observed operation."""
    operation = current.get()
    if operation is None:
        return call(*arguments)
    span, attached = _start(operation, extractor)
    token = _extracting.set(True)
    began = time.perf_counter()
    try:
        result = call(*arguments)
    except BaseException as exc:
        _extracting.reset(token)
        _end(operation, extractor, span, attached, began, None, type(exc).__name__)
        raise
    _extracting.reset(token)
    _end(operation, extractor, span, attached, began, result, None)
    return result


async def aobserved(extractor: str, call: Callable[..., Awaitable[R]], *arguments: Any) -> R:
    """:func:`observed` for an awaited extraction."""
    operation = current.get()
    if operation is None:
        return await call(*arguments)
    span, attached = _start(operation, extractor)
    began = time.perf_counter()
    try:
        result = await call(*arguments)
    except BaseException as exc:
        _end(operation, extractor, span, attached, began, None, type(exc).__name__)
        raise
    _end(operation, extractor, span, attached, began, result, None)
    return result


def _start(operation: Operation, extractor: str) -> tuple[Any, Any]:
    if not (operation.recording and operation.child_spans):
        return None, None
    api = otel()
    name, attributes = _span_labels(extractor)
    span = operation.tracer.start_span(name, kind=api.INTERNAL, attributes=attributes)
    return span, api.attach(api.in_context(span))


def _end(
    operation: Operation,
    extractor: str,
    span: Any,
    attached: Any,
    began: float,
    result: Extracted | None,
    raised: str | None,
) -> None:
    duration = time.perf_counter() - began
    status = "failed" if result is None else result.status
    error_type = raised
    if result is not None and result.error:
        error_type = result.error.split(":", 1)[0]
    if span is not None:
        _end_span(span, status, result, error_type)
        otel().detach(attached)
    elif operation.recording:
        if status == "failed":  # a span of its own, made now with the time it began
            api = otel()
            name, attributes = _span_labels(extractor)
            span = operation.tracer.start_span(
                name,
                context=api.in_context(operation.span),
                kind=api.INTERNAL,
                attributes=attributes,
                start_time=time.time_ns() - int(duration * 1e9),
            )
            _end_span(span, status, result, error_type)
        else:
            operation.span.set_attribute("zerda_store.extraction.duration", duration)
    instruments = operation.instruments
    if instruments is not None:
        attributes = _metric_attributes(extractor, status, operation.name)
        instruments.extraction_duration.record(duration, attributes)
        if status == "failed":
            instruments.extraction_failures.add(
                1, {**attributes, "error.type": error_type or "ExtractionError"}
            )


def _end_span(span: Any, status: str, result: Extracted | None, error_type: str | None) -> None:
    span.set_attribute("zerda_store.extraction.status", status)
    if result is not None:
        span.set_attribute("zerda_store.extraction.entities", len(result.entities))
    if status == "failed":
        api = otel()
        span.set_attribute("error.type", error_type or "ExtractionError")
        span.set_status(api.Status(api.ERROR, error_type or "ExtractionError"))
    span.end()


@functools.lru_cache(maxsize=64)
def _span_labels(extractor: str) -> tuple[str, dict[str, Any]]:
    """An extraction span's name and attributes at its start (shared: the SDK copies
    them)."""
    return f"{INTERNAL_SPAN} {extractor}", {"zerda_store.extraction.extractor": extractor}


@functools.lru_cache(maxsize=256)
def _metric_attributes(extractor: str, status: str, operation: str) -> dict[str, Any]:
    """An extraction's metric attributes (shared: never changed)."""
    return {
        "zerda_store.extraction.extractor": extractor,
        "zerda_store.extraction.status": status,
        "zerda_store.operation": operation,
    }


def carried(call: Callable[[str], T]) -> Callable[[str], T]:
    """``call`` to be run on another thread in the caller's context, inside an observed
    operation; ``call`` itself otherwise."""
    if current.get() is None:
        return call
    context = contextvars.copy_context()
    return lambda text: context.run(call, text)
