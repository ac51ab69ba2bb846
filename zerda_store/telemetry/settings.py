"""A store's telemetry settings: whether content may be recorded, how session ids are
shown, and which OpenTelemetry providers to use (the global ones unless given).

OpenTelemetry is looked up lazily, and only in modules already imported: a process that
never imported ``opentelemetry.trace`` has configured no tracer provider, so the check
costs a dictionary lookup and never imports the package.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import weakref
from typing import Any

from .labels import (
    INSTRUMENTATION_NAME,
    INSTRUMENTATION_VERSION,
    SCHEMA_URL,
    namespace_of,
    system_of,
)

# The GenAI conventions' opt-in for message content; "true" (or SPAN_ONLY,
# SPAN_AND_EVENT, EVENT_ONLY) also lets zerda_store record turn texts, names and snippets.
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# Which children an operation span gets: "all" (the default) or "failures".
CHILD_SPANS_ENV = "ZERDA_STORE_OTEL_CHILD_SPANS"
CHILD_SPANS = ("all", "failures")
_operations_logger = logging.getLogger("zerda_store.operations")
_CONTENT_ON = {"true", "1", "yes", "span_only", "span_and_event", "event_only"}


def content_from_env() -> bool:
    """Whether the environment opts in to recording content."""
    return os.environ.get(CONTENT_ENV, "").strip().lower() in _CONTENT_ON


class Telemetry:
    """How a :class:`Store` reports itself.

    ``record_content``: put turn texts, queries, entity names and recalled snippets on
    spans and log lines (off by default; None reads :data:`CONTENT_ENV`).
    ``hash_session_ids``: show session ids as a stable 16-hex-digit hash (the default;
    ``salt`` is mixed in, so that guessable ids cannot be looked up); False shows them as
    they are. ``tracer_provider`` / ``meter_provider``: OpenTelemetry providers to use
    instead of the global ones (tests pass the SDK's in-memory ones).
    """

    def __init__(
        self,
        *,
        record_content: bool | None = None,
        hash_session_ids: bool = True,
        salt: str = "",
        tracer_provider: Any = None,
        meter_provider: Any = None,
        child_spans: str | None = None,
    ) -> None:
        if child_spans is None:
            child_spans = os.environ.get(CHILD_SPANS_ENV, "").strip().lower() or "all"
        if child_spans not in CHILD_SPANS:
            raise ValueError(f"child_spans must be one of {CHILD_SPANS}, not {child_spans!r}")
        self.child_spans = child_spans
        self.record_content = content_from_env() if record_content is None else record_content
        self.hash_session_ids = hash_session_ids
        self.salt = salt.encode()
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self._lock = threading.Lock()
        self._tracer_of: Any = None
        self._tracer: Any = None
        self._meter_of: Any = None
        self._instruments: Any = None
        self._session_labels: dict[str, str] = {}
        self._labels: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()
        self._operation_labels: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return (
            f"Telemetry(record_content={self.record_content}, "
            f"hash_session_ids={self.hash_session_ids}, child_spans={self.child_spans!r})"
        )

    def session_label(self, session_id: str | None) -> str | None:
        """The session id as telemetry shows it: hashed unless asked otherwise."""
        if session_id is None or not self.hash_session_ids:
            return session_id
        label = self._session_labels.get(session_id)
        if label is None:
            digest = hashlib.blake2b(session_id.encode(), digest_size=8, key=self.salt[:64])
            label = digest.hexdigest()
            if len(self._session_labels) > 10_000:
                self._session_labels.clear()
            self._session_labels[session_id] = label
        return label

    def quiet(self) -> bool:
        """True when nothing can listen: no provider given, OpenTelemetry's trace and
        metrics modules never imported (so no global provider is set), and the
        operations' logger not at DEBUG. The hot path of every call: a few lookups."""
        if self.tracer_provider is not None or self.meter_provider is not None:
            return False
        modules = sys.modules
        if "opentelemetry.trace" in modules or "opentelemetry.metrics" in modules:
            return False
        return not _operations_logger.isEnabledFor(logging.DEBUG)

    def labels(self, store: Any) -> tuple[str, str]:
        """``db.system.name`` and ``db.namespace`` of ``store``, worked out once."""
        labels = self._labels.get(store)
        if labels is None:
            labels = self._labels[store] = (system_of(store), namespace_of(store))
        return labels

    def operation_labels(self, store: Any, name: str, gen_ai_operation: str) -> Any:
        """What an operation ``name`` on ``store`` shows, worked out once: ``db.system.name``,
        ``db.namespace``, its span's name, its metrics' attributes and its span's
        attributes but the session (both shared: never change them)."""
        by_name = self._operation_labels.get(store)
        if by_name is None:
            by_name = self._operation_labels.setdefault(store, {})
        labels = by_name.get((name, gen_ai_operation))
        if labels is None:
            system, namespace = self.labels(store)
            metric_attributes = {
                "gen_ai.operation.name": gen_ai_operation,
                "zerda_store.operation": name,
                "db.system.name": system,
            }
            span_attributes = {
                **metric_attributes,
                "gen_ai.memory.store.id": namespace,
                "db.namespace": namespace,
            }
            span_name = f"{gen_ai_operation} {namespace}"
            labels = (system, namespace, span_name, metric_attributes, span_attributes)
            by_name[(name, gen_ai_operation)] = labels
        return labels

    def tracer(self) -> Any:
        """The tracer to use, or None when no tracer provider is configured."""
        provider = self.tracer_provider
        if provider is None:
            trace = sys.modules.get("opentelemetry.trace")
            if trace is None:
                return None
            provider = trace.get_tracer_provider()
            if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
                return None
        if provider is self._tracer_of:
            return self._tracer
        tracer = provider.get_tracer(
            INSTRUMENTATION_NAME, INSTRUMENTATION_VERSION, schema_url=SCHEMA_URL
        )
        self._tracer_of, self._tracer = provider, tracer
        return tracer

    def instruments(self) -> Any:
        """The metric instruments (:class:`instruments.Instruments`), or None when no
        meter provider is configured."""
        provider = self.meter_provider
        if provider is None:
            metrics = sys.modules.get("opentelemetry.metrics")
            if metrics is None:
                return None
            provider = metrics.get_meter_provider()
            if isinstance(provider, metrics.NoOpMeterProvider) or (
                type(provider).__name__ == "_ProxyMeterProvider"
            ):
                return None
        if provider is self._meter_of:
            return self._instruments
        with self._lock:
            if provider is not self._meter_of:
                from .instruments import Instruments

                self._instruments = Instruments(provider)
                self._meter_of = provider
        return self._instruments


_default: Telemetry | None = None


def default_telemetry() -> Telemetry:
    """The settings of a store opened without ``telemetry=``: from the environment, the
    global providers; one object per process."""
    global _default
    if _default is None:
        _default = Telemetry()
    return _default
