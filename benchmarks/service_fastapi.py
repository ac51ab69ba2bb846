"""The FastAPI app of :mod:`benchmarks.service` as docs/async.md writes it, and its control.

- ``memory=True``: lifespan opens one shared :class:`Store`; ``POST /chat`` makes a memory
  for the request's customer, ``aload_memory_variables``, a 300 ms chat call,
  ``asave_context`` with the message id as ``idempotency_key``.
- ``memory=False`` (the control): the same app with the memory calls removed, each
  replaced by the extraction call it makes (the fake LLM's delay), so its ideal is the
  same and the ratio of the two is what the memory costs.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel

from benchmarks.service_apps import CHAT_SECONDS
from zerda_store import ConversationEntityMemory, Store


class Turn(BaseModel):
    customer: str
    message_id: str
    text: str


def make_fastapi_app(url: str, llm: Any, llm_workers: int, pool_size: int, *, memory: bool) -> Any:
    """The FastAPI app of docs/async.md (``memory=True``), or its control without the memory."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        store = Store(url, llm_workers=llm_workers, async_pool_size=pool_size)
        ConversationEntityMemory(store=store, auto_migrate=True)  # checks the schema once
        app.state.store = store
        yield
        await store.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/chat")
    async def chat(turn: Turn, request: Request) -> dict[str, Any]:
        began = time.monotonic()
        if memory:
            conversation = ConversationEntityMemory(
                llm,
                store=request.app.state.store,
                session_id=turn.customer,
                entity_extraction_prompt="{text}",
            )
            context = await conversation.aload_memory_variables({"input": turn.text})
            recalled = context["entity_info"]
        else:
            await llm.agenerate(turn.text)  # the recall's extraction, without the memory
            recalled = None
        loaded = time.monotonic()
        await asyncio.sleep(CHAT_SECONDS)  # the chat model
        answer = f"noted {turn.message_id}"
        chatted = time.monotonic()
        if memory:
            await conversation.asave_context(
                {"input": turn.text}, {"output": answer}, idempotency_key=turn.message_id
            )
        else:
            await llm.agenerate(f"{turn.text}\n{answer}")  # the save's extraction
        phases = [loaded - began, chatted - loaded, time.monotonic() - chatted]
        return {"recalled": recalled, "answer": answer, "phases": phases}

    return app
