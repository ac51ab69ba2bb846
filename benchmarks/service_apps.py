"""The services :mod:`benchmarks.service` measures, each served by uvicorn in a child process.

- ``fastapi`` and ``control``: the FastAPI app as docs/async.md writes it, and the same app
  without the memory (:mod:`benchmarks.service_fastapi`).
- ``asgi``: the same turn in a raw ASGI app (no framework).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

CHAT_SECONDS = 0.3
NAME = re.compile(r"\b[A-Z][A-Za-z0-9]{2,}\b")


class AsyncFakeLLM:
    """An extraction model that answers after ``delay`` seconds, awaited on the loop."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def agenerate(self, prompt: str, max_tokens: int = 100) -> str:
        if self.delay:
            await asyncio.sleep(self.delay)
        return ", ".join(dict.fromkeys(NAME.findall(prompt)))


class SyncFakeLLM:
    """The same model behind a blocking ``generate``."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def generate(self, prompt: str, max_tokens: int = 100) -> str:
        if self.delay:
            time.sleep(self.delay)
        return ", ".join(dict.fromkeys(NAME.findall(prompt)))


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def make_app(url: str, llm: Any, llm_workers: int, pool_size: int = 10) -> Any:
    """A raw ASGI app: lifespan opens and closes the one Store; POST /chat is one turn."""
    from zerda_store import ConversationEntityMemory, Store

    state: dict[str, Any] = {}

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                store = Store(url, llm_workers=llm_workers, async_pool_size=pool_size)
                # Checks (SQLite: makes) the schema once, before the first request.
                ConversationEntityMemory(store=store, auto_migrate=True)
                state["store"] = store
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await state["store"].aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def chat(body: dict[str, Any]) -> dict[str, Any]:
        memory = ConversationEntityMemory(
            llm,
            store=state["store"],
            session_id=body["customer"],
            entity_extraction_prompt="{text}",
        )
        began = time.monotonic()
        recalled = await memory.aload_memory_variables({"input": body["text"]})
        loaded = time.monotonic()
        await asyncio.sleep(CHAT_SECONDS)  # the chat model
        answer = f"noted {body['message_id']}"
        chatted = time.monotonic()
        await memory.asave_context(
            {"input": body["text"]}, {"output": answer}, idempotency_key=body["message_id"]
        )
        phases = [loaded - began, chatted - loaded, time.monotonic() - chatted]
        return {"recalled": recalled["entity_info"], "answer": answer, "phases": phases}

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            status, payload = 200, await chat(json.loads(raw))
        except Exception as exc:
            status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
        body = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def make(kind: str, url: str, llm: Any, llm_workers: int, pool_size: int) -> Any:
    """The app of one kind: ``fastapi``, ``control`` or ``asgi``."""
    if kind == "asgi":
        return make_app(url, llm, llm_workers, pool_size)
    from benchmarks.service_fastapi import make_fastapi_app

    return make_fastapi_app(url, llm, llm_workers, pool_size, memory=kind == "fastapi")
