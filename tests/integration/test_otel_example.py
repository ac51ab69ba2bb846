"""examples/otel_fastapi.py: one request is one trace, the HTTP span over the memory's
spans over their extraction and units of work."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integration.markdown_blocks import REPO_ROOT


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "otel_fastapi", REPO_ROOT / "examples" / "otel_fastapi.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_request_is_one_trace_from_the_http_span_to_the_units_of_work(
    database_url: str,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = example().make_app(database_url, tracer_provider=provider)
    with TestClient(app) as client:
        turn = {"customer_id": "c-1", "message_id": "m-1", "text": "Sarah joined Acme Corp."}
        assert client.post("/chat", json=turn).status_code == 200
        exporter.clear()  # the first request made the session; look at the second
        asked = {"customer_id": "c-1", "message_id": "m-2", "text": "Where is Sarah now?"}
        assert "Sarah joined Acme" in client.post("/chat", json=asked).json()["answer"]

    spans = exporter.get_finished_spans()
    assert len({span.context.trace_id for span in spans}) == 1
    by_id = {span.context.span_id: span for span in spans}

    def parent(span: ReadableSpan) -> ReadableSpan | None:
        return by_id[span.parent.span_id] if span.parent is not None else None

    (root,) = [span for span in spans if span.parent is None]
    assert root.name == "POST /chat"
    memory = [span for span in spans if span.name.split()[0].endswith("_memory")]
    assert sorted(span.name.split()[0] for span in memory) == ["search_memory", "update_memory"]
    assert all(parent(span) is root for span in memory)
    units = [span for span in spans if span.name.split()[0] in ("read", "write")]
    extractions = [span for span in spans if span.name.startswith("extract_entities")]
    assert units and len(extractions) == 2
    for span in [*units, *extractions]:
        assert parent(span) in memory
    assert {parent(span).name.split()[0] for span in units} == {  # type: ignore[union-attr]
        "search_memory",
        "update_memory",
    }
