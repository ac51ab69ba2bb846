"""The async extraction path: async LLMs and extractors awaited on the loop, sync ones on
the given executor, failures counted as on the sync path, cancellation passed through."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.doubles import AsyncOnlyLLM
from zerda_store.extraction import ExtractedEntity, ExtractionService, LLMExtractor

pytestmark = pytest.mark.asyncio


async def test_agenerate_is_awaited_with_the_originals_prompt_and_parsing() -> None:
    llm = AsyncOnlyLLM()
    result = await ExtractionService().aextract("Sarah joined", LLMExtractor(llm, "<{text}>"))
    assert (result.status, result.names) == ("ok", ["Sarah", "Acme Corp"])
    assert llm.prompts == ["<Sarah joined>"]


async def test_a_coroutine_extract_is_awaited() -> None:
    class Extractor:
        name = "mine"

        async def extract(self, text: str) -> list[ExtractedEntity]:
            return [ExtractedEntity("Omar", "PERSON")]

    result = await ExtractionService().aextract("Omar", Extractor())  # type: ignore[arg-type]
    assert result.entities == (ExtractedEntity("Omar", "PERSON"),)


async def test_a_sync_llm_runs_on_the_given_executor() -> None:
    seen: list[str] = []

    class SyncLLM:
        def generate(self, prompt: str, max_tokens: int = 100) -> str:
            seen.append(threading.current_thread().name)
            return "Sarah"

    with ThreadPoolExecutor(2, thread_name_prefix="mine") as executor:
        result = await ExtractionService().aextract("Sarah", LLMExtractor(SyncLLM()), executor)
    assert result.names == ["Sarah"] and seen[0].startswith("mine")


async def test_an_async_failure_is_counted_not_raised() -> None:
    class Failing(AsyncOnlyLLM):
        async def agenerate(self, prompt: str, max_tokens: int = 100) -> str:
            raise TimeoutError("no answer")

    service = ExtractionService()
    result = await service.aextract("Sarah", LLMExtractor(Failing()))
    assert result.status == "failed" and "no answer" in (result.error or "")
    assert service.error_count == 1


async def test_blank_text_calls_no_model() -> None:
    llm = AsyncOnlyLLM()
    result = await ExtractionService().aextract("  ", LLMExtractor(llm))
    assert result.status == "skipped" and llm.prompts == []


async def test_cancellation_is_not_swallowed() -> None:
    class Slow(AsyncOnlyLLM):
        async def agenerate(self, prompt: str, max_tokens: int = 100) -> str:
            await asyncio.sleep(5)
            return "Sarah"

    service = ExtractionService()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(service.aextract("Sarah", LLMExtractor(Slow())), 0.05)
    assert service.error_count == 0
