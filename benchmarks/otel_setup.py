"""The OpenTelemetry SDK set up in the benchmark's service: ``ZERDA_BENCH_OTEL=traces``,
the global tracer provider with a BatchSpanProcessor; ``ZERDA_BENCH_OTEL=all``, a meter
provider too; both exporting nowhere, so that a run measures what recording costs the
service (not a collector)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class Dropped(SpanExporter):
    """Takes every batch and keeps nothing."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def configure(what: str = "traces") -> None:
    """``traces``: the tracer provider only; ``all``: a meter provider too."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(tracer_provider)
    if what == "all":
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
