from __future__ import annotations

import logging
import threading

import pytest

from tests.doubles import BrokenLLM, FixedLLM, RecordingLLM, stanza_document
from zerda_store.extraction import (
    DEFAULT_EXTRACTION_PROMPT,
    ExtractedEntity,
    ExtractionService,
    LLMExtractor,
    StanzaExtractor,
)


def test_llm_path_formats_the_prompt_and_asks_for_100_tokens():
    llm = RecordingLLM("Sarah")
    LLMExtractor(llm, "find: {text}").extract("hello")
    assert llm.calls == [("find: hello", 100)]


def test_llm_path_splits_on_commas_strips_and_drops_short_fragments():
    llm = RecordingLLM(" Sarah , Al, , Acme Corp,x,Bob ")
    assert [e.name for e in LLMExtractor(llm).extract("t")] == ["Sarah", "Acme Corp", "Bob"]


def test_llm_entities_have_unknown_type():
    assert LLMExtractor(FixedLLM("Sarah")).extract("t") == [ExtractedEntity("Sarah", "unknown")]


def test_default_prompt_has_the_text_placeholder_twice():
    assert DEFAULT_EXTRACTION_PROMPT.count("{text}") == 2


PROMPTS = [
    DEFAULT_EXTRACTION_PROMPT,
    "{text}",
    "find: {text} in {text}.",
    "braces {{kept}} {text} {{",
    "no field at all {{}}",
    "",
    "{text!r}",
    "{text:>9}",
    "{0}",
    "{other} {text}",
    "{",
    "}",
    "{ text}",
]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("text", ["Sarah at Acme", "", "{x} }{", "أحمد، شركة النور"])
def test_the_prompt_is_filled_as_str_format_fills_it(prompt, text):
    llm = RecordingLLM("Sarah")
    try:
        expected = prompt.format(text=text)
    except (ValueError, KeyError, IndexError) as exc:
        with pytest.raises(type(exc)):
            LLMExtractor(llm, prompt).extract(text)
        return
    LLMExtractor(llm, prompt).extract(text)
    assert llm.calls == [(expected, 100)]


def test_blank_text_is_skipped_without_calling_the_model():
    llm = RecordingLLM("Sarah")
    result = ExtractionService(LLMExtractor(llm)).extract("  \n ")
    assert (result.status, result.entities, llm.calls) == ("skipped", (), [])


def test_failures_are_counted_logged_once_and_never_raised(caplog):
    service = ExtractionService(LLMExtractor(BrokenLLM()))
    with caplog.at_level(logging.ERROR, logger="zerda_store.extraction"):
        first = service.extract("Sarah")
        second = service.extract("Sarah")
    assert first.status == second.status == "failed"
    assert service.error_count == 2
    assert service.last_error == "RuntimeError: timeout"
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


def test_a_non_string_answer_is_a_failure():
    class NumberLLM:
        def generate(self, prompt, max_tokens=256):
            return 42

    result = ExtractionService(LLMExtractor(NumberLLM())).extract("Sarah")
    assert result.status == "failed" and "int" in (result.error or "")


def test_unstorable_names_are_dropped(caplog):
    llm = FixedLLM("Sarah, " + "x" * 300)
    result = ExtractionService(LLMExtractor(llm)).extract("t")
    assert result.names == ["Sarah"]


def test_custom_extractors_may_return_strings_pairs_or_entities():
    class Mixed:
        name = "mixed"

        def extract(self, text):
            return ["Sarah", ("Acme", "ORG"), ExtractedEntity("Paris", "GPE")]

    result = ExtractionService(Mixed()).extract("t")
    assert result.extractor == "mixed"
    assert [(e.name, e.entity_type) for e in result.entities] == [
        ("Sarah", "unknown"),
        ("Acme", "ORG"),
        ("Paris", "GPE"),
    ]


def test_stanza_pipeline_is_told_never_to_download_unless_asked():
    assert StanzaExtractor("en").pipeline_options() == {
        "lang": "en",
        "processors": "tokenize,ner",
        "download_method": None,
    }
    assert "download_method" not in StanzaExtractor("en", download=True).pipeline_options()
    assert StanzaExtractor("ar", stanza_dir="/m").pipeline_options()["dir"] == "/m"


def test_stanza_path_builds_one_pipeline_for_concurrent_first_calls(monkeypatch):
    import sys
    import types

    built = []

    class Pipeline:
        def __init__(self, **options):
            built.append(options)

        def __call__(self, text):
            return stanza_document(("Sarah", "PERSON"), ("42", "CARDINAL"))

    monkeypatch.setitem(sys.modules, "stanza", types.SimpleNamespace(Pipeline=Pipeline))
    extractor = StanzaExtractor("en")
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(extractor.extract("Sarah 42")))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1
    # "42" is neither alphabetic nor longer than three characters: dropped, as in the original
    assert results == [[ExtractedEntity("Sarah", "PERSON")]] * 8


def test_a_missing_stanza_model_is_reported_with_the_command_that_fixes_it(monkeypatch):
    import sys
    import types

    def pipeline(**options):
        raise FileNotFoundError("Resources file not found at: /nowhere/resources.json")

    monkeypatch.setitem(sys.modules, "stanza", types.SimpleNamespace(Pipeline=pipeline))
    service = ExtractionService(StanzaExtractor("en"))
    result = service.extract("Sarah")
    assert result.status == "failed"
    assert "zerda-store models download en" in (result.error or "")


def test_service_without_any_extractor_is_a_programming_error():
    with pytest.raises(ValueError):
        ExtractionService().extract("text")


def test_what_the_per_name_caches_hold_is_bounded_by_length_too():
    """A model that ignores max_tokens, or an extractor that returns huge names, must not
    fill the per-name caches with long text: they are bounded by entries, so each entry
    must be short for their memory to be bounded."""
    from zerda_store import extraction

    class Names:
        name = "names"

        def __init__(self, names: list[str]) -> None:
            self.names = names

        def extract(self, text: str) -> list[str]:
            return self.names

    extraction._parsed_entity.cache_clear()
    extraction._acceptable_name.cache_clear()
    huge = [f"{i:05d}" + "x" * 5_000 for i in range(40)]
    service = ExtractionService()
    answer = service.extract("t", LLMExtractor(FixedLLM(", ".join(huge))))
    assert answer.status == "ok" and answer.entities == ()  # each name too long: skipped
    returned = service.extract("t", Names([*huge, "Sarah"]))
    assert [entity.name for entity in returned.entities] == ["Sarah"]
    assert extraction._parsed_entity.cache_info().currsize == 0
    assert extraction._acceptable_name.cache_info().currsize == 1  # "Sarah" alone

    usual = service.extract("t", LLMExtractor(FixedLLM("Sarah, Acme Corp")))
    assert [entity.name for entity in usual.entities] == ["Sarah", "Acme Corp"]
    assert extraction._parsed_entity.cache_info().currsize == 2  # a model's usual answer
