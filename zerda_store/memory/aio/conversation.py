"""The awaitable twins of :class:`self.ConversationEntityMemory`'s calls.

Each runs the same validation, the same units of work (built once by the repository,
the erasure and the ledger) and the same retention rules as its sync twin, awaited on the
store's database threads (:mod:`zerda_store.db.aio.unit_of_work`); extraction awaits an async LLM
(``agenerate``) or extractor on the event loop, and runs a synchronous one on the
store's LLM threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Self

from ...extraction import ExtractionResult
from ...model.records import ForgetReceipt, turn_text
from ...retention.policy import Visibility
from ...telemetry.operations import DELETE, SEARCH, UPDATE, counts, note_recall, observed
from ...telemetry.operations import current as observed_operation
from ...turns.aio.repository import AsyncRepository
from ...validation import mapping_text
from ..base import RECALL_LIMIT, MemoryCore, checked_key, entity_info, outcome, store_core


class AsyncMethods(MemoryCore):
    """The async methods of :class:`conversation.ConversationEntityMemory`."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """:meth:`close` from async code: waits for running units of work on a thread."""
        if self._owns_store:
            await self._store.aclose()

    def _async_repository(self) -> AsyncRepository:
        return AsyncRepository(self._repository)

    async def _aextract(self, text: str) -> ExtractionResult:
        """:meth:`_extract` from async code: an async LLM (``agenerate``) or extractor is
        awaited on the event loop; a synchronous one runs on the store's LLM threads."""
        extractor = self._current_extractor()
        return await self._extraction.aextract(text, extractor, self._store.llm_executor)

    async def _avisible(self) -> Visibility | None:
        """:meth:`_visible`, its read of the session's last activity awaited."""
        policy = await self._policy.aget()
        if policy is None:
            return None
        return await self._policies.avisibility(self.session_id, policy, self._now())

    async def _acheck_key_rules(self) -> None:
        """:meth:`_check_key_rules`, its read awaited."""
        check = self._repository.key_rules_check(self.session_id)
        if check is not None:
            await self._store.aread(check)

    async def _aexpire_if_idle(self) -> None:
        """:meth:`_expire_if_idle`, awaited: the rule's read awaited, the (rare, batched)
        prune on one of the store's database threads."""
        policy = await self._policy.aget()
        if policy is None:
            return
        if (await self._policies.avisibility(self.session_id, policy, self._now())).idle_expired:
            pruner, session_id = self._pruner(), self.session_id
            await self._store.arun(lambda: pruner.prune(session_id))

    @observed(UPDATE, store=store_core)
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
        key = checked_key(idempotency_key)
        texts = self._texts(inputs, outputs)
        repository = self._async_repository()
        if key is not None and await repository.has_turn(self.session_id, key):
            return
        self._store.check_writable()  # before extraction: no model call for a refused write
        await self._aexpire_if_idle()
        turn = self._new_turn(texts, await self._aextract(turn_text(*texts)), key)
        await repository.save_turn(self.session_id, turn)

    @observed(SEARCH, store=store_core)
    async def aload_memory_variables(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`load_memory_variables`, awaited."""
        input_text = mapping_text(inputs, self.input_key, "inputs")
        await self._acheck_key_rules()
        mentions = self._mentions(await self._aextract(input_text))
        recalled = await self._async_repository().recall(
            self.session_id, mentions, RECALL_LIMIT, await self._avisible()
        )
        if observed_operation.get() is not None:
            note_recall(recalled, input_text)
        return self._variables(recalled)

    @observed(DELETE, store=store_core)
    async def aclear(self) -> None:
        """:meth:`clear`, awaited."""
        await self._erasure.aclear(self.session_id)

    async def aget_memory_stats(self) -> dict[str, Any]:
        """:meth:`get_memory_stats`, awaited."""
        visible = await self._avisible()
        return self._stats(await self._async_repository().stats(self.session_id, visible))

    @observed(SEARCH, store=store_core)
    async def aget_entity_info(self, entity_name: str) -> dict[str, Any] | None:
        """:meth:`get_entity_info`, awaited."""
        mention = self._named(entity_name)
        await self._acheck_key_rules()
        visible = await self._avisible()
        details = await self._async_repository().entity_details(
            self.session_id, mention, RECALL_LIMIT, visible
        )
        return entity_info(details)

    async def alist_entities(self) -> list[str]:
        """:meth:`list_entities`, awaited."""
        visible = await self._avisible()
        entities = await self._async_repository().list_entities(self.session_id, visible)
        return [entity.name for entity in entities]

    @observed(DELETE, store=store_core, done=counts)
    async def aforget_entity(
        self, name: str, *, with_turns: bool = False, dry_run: bool = False
    ) -> dict[str, Any]:
        """:meth:`forget_entity`, awaited."""
        key = self._key(name)
        await self._acheck_key_rules()
        receipt = await self._erasure.aforget_entity(
            self.session_id,
            key,
            with_turns=with_turns,
            normalize=self.normalize_names,
            dry_run=dry_run,
        )
        return asdict(receipt or ForgetReceipt())

    @observed(UPDATE, store=store_core, done=counts)
    async def areextract(self) -> dict[str, int]:
        """:meth:`reextract`, awaited (one failed turn at a time, as there)."""
        self._store.check_writable()
        counts = {"repaired": 0, "failed": 0}
        for turn in await self._ledger.afailed_turns(self.session_id):
            result = await self._aextract(turn.text)
            recorded = await self._ledger.arepair_turn(
                turn, self._mentions(result), outcome(result), self._now()
            )
            if recorded:
                counts["repaired" if result.status == "ok" else "failed"] += 1
        return counts
