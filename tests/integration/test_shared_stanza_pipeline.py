"""One stanza pipeline per process: ``StanzaExtractor.shared`` gives one object per
settings, and memories without an LLM share it (a stand-in stanza module records loads)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

import zerda_store.extraction as extraction_module
from tests.doubles import say
from zerda_store import StanzaExtractor


@pytest.fixture
def fake_stanza(monkeypatch) -> list[dict[str, Any]]:
    """A stand-in ``stanza`` module whose Pipeline records the options of each
    construction and tags the known names; returns those options. The shared extractors
    start empty and are put back afterwards."""
    built: list[dict[str, Any]] = []
    known = {"Sarah Chen": "PERSON", "Acme Corp": "ORG"}

    class Pipeline:
        def __init__(self, **options: Any) -> None:
            built.append(options)

        def __call__(self, text: str) -> Any:
            found = sorted((text.find(name), name) for name in known if name in text)
            ents = [types.SimpleNamespace(text=name, type=known[name]) for _, name in found]
            return types.SimpleNamespace(ents=ents)

    monkeypatch.setitem(sys.modules, "stanza", types.SimpleNamespace(Pipeline=Pipeline))
    monkeypatch.setattr(extraction_module, "_SHARED", {})
    return built


def test_stanza_extractor_shared_is_one_object_per_settings(fake_stanza, tmp_path):
    english = StanzaExtractor.shared("en")

    assert isinstance(english, StanzaExtractor)
    assert english.lang == "en"
    assert StanzaExtractor.shared("en") is english
    assert StanzaExtractor.shared("de") is not english
    assert StanzaExtractor.shared("de") is StanzaExtractor.shared("de")
    assert StanzaExtractor.shared("en", stanza_dir=str(tmp_path)) is not english
    assert StanzaExtractor.shared("en", download=True) is not english
    assert fake_stanza == []  # nothing is loaded before the first extraction


def test_memories_without_an_llm_share_one_stanza_pipeline(fake_stanza, make_memory):
    first = make_memory(session_id="first")
    second = make_memory(session_id="second")

    say(first, "Sarah Chen joined Acme Corp")
    say(second, "Acme Corp renewed")
    recalled = second.load_memory_variables({"input": "Acme Corp?"})["entity_info"]

    assert fake_stanza == [{"lang": "en", "processors": "tokenize,ner", "download_method": None}]
    assert first.list_entities() == ["Sarah Chen", "Acme Corp"]
    assert first.get_entity_info("Sarah Chen")["type"] == "PERSON"
    assert second.get_entity_info("Acme Corp")["type"] == "ORG"
    assert recalled == "Previous information about Acme Corp:\nAcme Corp renewed ok"

    german = make_memory(lang="de", session_id="german")
    say(german, "Acme Corp in Berlin")
    assert [options["lang"] for options in fake_stanza] == ["en", "de"]
