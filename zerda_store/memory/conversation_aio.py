"""The awaitable twins of :class:`memory.ConversationEntityMemory`'s calls.

Each runs the same validation, the same units of work (built once by the repository,
the erasure and the ledger) and the same retention rules as its sync twin, awaited on the
store's database threads (:mod:`zerda_store.db.unit_of_work_aio`); extraction awaits an async LLM
(``agenerate``) or extractor on the event loop, and runs a synchronous one on the
store's LLM threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, cast

from ..db.validation import mapping_text
from ..extraction import ExtractionResult
from ..model.records import ForgetReceipt, turn_text
from ..retention.policies import Visibility, visibility
from ..turns.repository_aio import AsyncRepository
from .base import RECALL_LIMIT, checked_key, entity_info, outcome

if TYPE_CHECKING:
    from .conversation import ConversationEntityMemory


class AsyncMemory:
    """The async methods of :class:`memory.ConversationEntityMemory`."""

    async def __aenter__(self) -> ConversationEntityMemory:
        return _memory(self)

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """:meth:`close` from async code: waits for running units of work on a thread."""
        memory = _memory(self)
        if memory._owns_store:
            await memory.store.aclose()

    def _async_repository(self) -> AsyncRepository:
        return AsyncRepository(_memory(self)._repository)

    async def _aextract(self, text: str) -> ExtractionResult:
        """:meth:`_extract` from async code: an async LLM (``agenerate``) or extractor is
        awaited on the event loop; a synchronous one runs on the store's LLM threads."""
        memory = _memory(self)
        extractor = memory._current_extractor()
        return await memory._extraction.aextract(text, extractor, memory.store.llm_executor)

    async def _avisible(self) -> Visibility | None:
        """:meth:`_visible`, its read of the session's last activity awaited."""
        memory = _memory(self)
        policy = await memory._policy.aget()
        if policy is None:
            return None
        last = None
        if policy.general.session_idle is not None:
            policies, session_id = memory._policies, memory.session_id
            last = await memory.store.aread(lambda t: policies.last_activity(t, session_id))
        return visibility(policy, memory._now(), last)

    async def _aexpire_if_idle(self) -> None:
        """:meth:`_expire_if_idle` (a rare, batched prune) on a thread, when a policy
        expires idle sessions."""
        memory = _memory(self)
        policy = await memory._policy.aget()
        if policy is not None and policy.general.session_idle is not None:
            await asyncio.to_thread(memory._expire_if_idle)

    async def asave_context(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
    ) -> None:
        """:meth:`save_context`, awaited: extraction, then one write transaction on a
        database thread. Cancelled before its COMMIT is sent, it stores nothing; cancelled
        later, it raises :class:`CancelledAfterCommitError` (the turn is stored). Only an
        ``idempotency_key`` makes a retry after a cancellation or an error safe."""
        memory = _memory(self)
        key = checked_key(idempotency_key)
        texts = memory._texts(inputs, outputs)
        repository = memory._async_repository()
        if key is not None and await repository.has_turn(memory.session_id, key):
            return
        memory.store.check_writable()  # before extraction: no model call for a refused write
        await memory._aexpire_if_idle()
        turn = memory._new_turn(texts, await memory._aextract(turn_text(*texts)), key)
        await repository.save_turn(memory.session_id, turn)

    async def aload_memory_variables(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`load_memory_variables`, awaited."""
        memory = _memory(self)
        input_text = mapping_text(inputs, memory.input_key, "inputs")
        mentions = memory._mentions(await memory._aextract(input_text))
        recalled = await memory._async_repository().recall(
            memory.session_id, mentions, RECALL_LIMIT, await memory._avisible()
        )
        return memory._variables(recalled)

    async def aclear(self) -> None:
        """:meth:`clear`, awaited."""
        memory = _memory(self)
        await memory._erasure.aclear(memory.session_id)

    async def aget_memory_stats(self) -> dict[str, Any]:
        """:meth:`get_memory_stats`, awaited."""
        memory = _memory(self)
        visible = await memory._avisible()
        return memory._stats(await memory._async_repository().stats(memory.session_id, visible))

    async def aget_entity_info(self, entity_name: str) -> dict[str, Any] | None:
        """:meth:`get_entity_info`, awaited."""
        memory = _memory(self)
        mention = memory._named(entity_name)
        visible = await memory._avisible()
        details = await memory._async_repository().entity_details(
            memory.session_id, mention, RECALL_LIMIT, visible
        )
        return entity_info(details)

    async def alist_entities(self) -> list[str]:
        """:meth:`list_entities`, awaited."""
        memory = _memory(self)
        visible = await memory._avisible()
        entities = await memory._async_repository().list_entities(memory.session_id, visible)
        return [entity.name for entity in entities]

    async def aforget_entity(self, name: str, *, with_turns: bool = False) -> dict[str, Any]:
        """:meth:`forget_entity`, awaited."""
        memory = _memory(self)
        receipt = await memory._erasure.aforget_entity(
            memory.session_id,
            memory._key(name),
            with_turns=with_turns,
            normalize=memory.normalize_names,
        )
        return asdict(receipt or ForgetReceipt())

    async def areextract(self) -> dict[str, int]:
        """:meth:`reextract`, awaited (one failed turn at a time, as there)."""
        memory = _memory(self)
        memory.store.check_writable()
        counts = {"repaired": 0, "failed": 0}
        for turn in await memory._ledger.afailed_turns(memory.session_id):
            result = await memory._aextract(turn.text)
            recorded = await memory._ledger.arepair_turn(
                turn, memory._mentions(result), outcome(result), memory._now()
            )
            if recorded:
                counts["repaired" if result.status == "ok" else "failed"] += 1
        return counts


def _memory(mixin: AsyncMemory) -> ConversationEntityMemory:
    return cast("ConversationEntityMemory", mixin)
