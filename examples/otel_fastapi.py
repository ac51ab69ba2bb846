"""A chat service whose every request is one trace: the HTTP server span (OpenTelemetry's
FastAPI instrumentation), the memory's spans (``search_memory``, ``update_memory``) with
their extraction and database units of work under them. See docs/observability.md.

    pip install "zerda-store[otel,fastapi]" opentelemetry-sdk \\
        opentelemetry-instrumentation-fastapi
    python examples/otel_fastapi.py                 # spans printed on the console
    python examples/otel_fastapi.py --otlp          # to an OTLP collector (needs
        # opentelemetry-exporter-otlp; OTEL_EXPORTER_OTLP_ENDPOINT, default localhost:4318)
    curl -X POST localhost:8000/chat -H 'content-type: application/json' \\
        -d '{"customer_id": "c-1", "message_id": "m-1", "text": "Sarah joined Acme Corp."}'

The memory here extracts capitalized words (no model needed); pass your LLM instead.
Turn texts and names stay out of the spans unless you set
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``; customer ids are hashed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from pydantic import BaseModel

from zerda_store import ConversationEntityMemory, Store, Telemetry


class CapitalizedWords:
    """A stand-in extraction model: the capitalized words of the text, comma-separated."""

    async def agenerate(self, prompt: str, max_tokens: int = 100) -> str:
        await asyncio.sleep(0)  # where a real model would be awaited
        return ", ".join(dict.fromkeys(re.findall(r"\b[A-Z][a-z]{2,}\b", prompt)))

    def generate(self, prompt: str, max_tokens: int = 100) -> str:
        return ", ".join(dict.fromkeys(re.findall(r"\b[A-Z][a-z]{2,}\b", prompt)))


class Turn(BaseModel):
    customer_id: str
    message_id: str
    text: str


def make_app(
    database_url: str, *, llm: Any = None, tracer_provider: Any = None, meter_provider: Any = None
) -> FastAPI:
    """The service: one shared store, a memory per request. Its spans go to the given
    providers, else to the global ones (:func:`configure_tracing`)."""
    model = llm if llm is not None else CapitalizedWords()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
        store = Store(database_url, telemetry=telemetry)
        ConversationEntityMemory(store=store, auto_migrate=True)  # checks the schema once
        app.state.store = store
        yield
        await store.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/chat")
    async def chat(turn: Turn, request: Request) -> dict[str, Any]:
        memory = ConversationEntityMemory(
            model,
            store=request.app.state.store,
            session_id=turn.customer_id,
            entity_extraction_prompt="{text}",
        )
        recalled = (await memory.aload_memory_variables({"input": turn.text}))["entity_info"]
        answer = f"(your chat model, told: {recalled or 'nothing yet'})"
        await memory.asave_context(
            {"input": turn.text}, {"output": answer}, idempotency_key=turn.message_id
        )
        return {"answer": answer}

    FastAPIInstrumentor.instrument_app(app, tracer_provider=tracer_provider)
    return app


def configure_tracing(exporter: SpanExporter) -> TracerProvider:
    """The global tracer provider, its spans batched to ``exporter``."""
    provider = TracerProvider(resource=Resource.create({"service.name": "chat-service"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--otlp", action="store_true", help="export to an OTLP collector")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if args.otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        configure_tracing(OTLPSpanExporter())
    else:
        configure_tracing(ConsoleSpanExporter())
    import uvicorn

    url = os.environ.get("ZERDA_STORE_DATABASE_URL", "sqlite:///zerda_store.db")
    uvicorn.run(make_app(url), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
