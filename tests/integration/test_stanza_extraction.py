"""The stanza path end to end: real stanza pipelines over the tiny models in tests/data/stanza.

The models are trained on synthetic sentences (tests/stanza_models), so they are only
trusted on sentences like the training data: the tests use the build's probe sentences.
Every test here runs with outgoing connections refused, so any network attempt fails it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.doubles import FixedLLM
from tests.stanza_models.generate import PROBES
from zerda_store.extraction import StanzaExtractor

stanza = pytest.importorskip("stanza")
torch = pytest.importorskip("torch")

MODELS = Path(__file__).resolve().parents[1] / "data" / "stanza"
ENGLISH_TURN = ({"input": "Sarah Connor joined Acme Corp in Paris."}, {"output": "Noted."})
ARABIC_TURN = (
    {"input": "انضم محمد الأحمد إلى شركة أكمي في باريس."},
    {"output": "شكرا على المعلومة."},
)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Two threads on two cores are many times slower whenever anything else is busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def network_attempts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Refuse every outgoing Python socket connection; the test fails if one was tried."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError("network access is refused in the stanza tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield attempts
    assert attempts == [], f"tried to connect: {attempts}"


@pytest.fixture(scope="module")
def english() -> StanzaExtractor:
    """Shared by the module's tests: the extractor keeps its pipeline once built."""
    return StanzaExtractor("en", stanza_dir=str(MODELS))


@pytest.fixture(scope="module")
def arabic() -> StanzaExtractor:
    return StanzaExtractor("ar", stanza_dir=str(MODELS))


def _types(memory: Any, names: list[str]) -> dict[str, str]:
    return {name: memory.get_entity_info(name)["type"] for name in names}


def test_resources_index_lists_every_shipped_model_with_its_md5() -> None:
    resources = json.loads((MODELS / "resources.json").read_text("utf-8"))
    for lang in ("en", "ar"):
        for processor in ("tokenize", "ner", "pretrain"):
            model = MODELS / lang / processor / "tiny.pt"
            md5 = hashlib.md5(model.read_bytes()).hexdigest()
            assert resources[lang][processor]["tiny"]["md5"] == md5, model
        assert "mwt" not in resources[lang]["packages"]["default"]


@pytest.mark.parametrize(
    ("lang", "text", "expected"),
    [(lang, probe.text, probe.entities) for lang, probes in PROBES.items() for probe in probes],
)
def test_probe_sentence_gives_its_entities(
    lang: str, text: str, expected: tuple[tuple[str, str], ...], english: Any, arabic: Any
) -> None:
    extractor = english if lang == "en" else arabic
    found = tuple((entity.name, entity.entity_type) for entity in extractor.extract(text))
    assert found == expected


def test_arabic_pipeline_runs_without_multi_word_token_expansion(arabic: StanzaExtractor) -> None:
    arabic.extract("شكرا على المعلومة.")
    assert set(arabic._pipeline.processors) == {"tokenize", "ner"}


def test_english_names_are_stored_with_their_stanza_types(
    make_memory: Any, english: StanzaExtractor
) -> None:
    memory = make_memory(extractor=english)
    memory.save_context(*ENGLISH_TURN)

    assert memory.list_entities() == ["Sarah Connor", "Acme Corp", "Paris"]
    assert _types(memory, ["Sarah Connor", "acme corp", "PARIS"]) == {
        "Sarah Connor": "PERSON",
        "acme corp": "ORG",
        "PARIS": "GPE",
    }
    recalled = memory.load_memory_variables({"input": "Tell me more about Sarah Connor."})
    assert recalled["entity_info"] == (
        "Previous information about Sarah Connor:\nSarah Connor joined Acme Corp in Paris. Noted."
    )
    assert memory.get_memory_stats()["extraction_errors"] == 0


def test_arabic_names_are_stored_with_their_stanza_types(
    make_memory: Any, arabic: StanzaExtractor
) -> None:
    memory = make_memory(lang="ar", extractor=arabic)
    memory.save_context(*ARABIC_TURN)

    assert memory.list_entities() == ["محمد الأحمد", "شركة أكمي", "باريس"]
    # "الاحمد" without the hamza is the same entity once names are normalized.
    assert _types(memory, ["محمد الاحمد", "شركة أكمي", "باريس"]) == {
        "محمد الاحمد": "PER",
        "شركة أكمي": "ORG",
        "باريس": "LOC",
    }
    recalled = memory.load_memory_variables({"input": "أخبرني المزيد عن محمد الأحمد."})
    assert recalled["entity_info"].startswith("معلومات سابقة عن محمد الأحمد:\nانضم محمد الأحمد")


def test_unknown_type_from_an_llm_turn_takes_the_stanza_type(
    make_memory: Any, english: StanzaExtractor
) -> None:
    llm_memory = make_memory(FixedLLM("Sarah Connor"), session_id="shared")
    llm_memory.save_context({"input": "I had lunch with Sarah Connor."}, {"output": "Nice."})
    assert llm_memory.get_entity_info("Sarah Connor")["type"] == "unknown"

    make_memory(extractor=english, session_id="shared").save_context(*ENGLISH_TURN)
    assert llm_memory.get_entity_info("Sarah Connor")["type"] == "PERSON"

    llm_memory.save_context({"input": "Sarah Connor called again."}, {"output": "OK."})
    info = llm_memory.get_entity_info("Sarah Connor")
    assert (info["type"], info["contexts_count"]) == ("PERSON", 3)


@pytest.mark.slow
def test_memory_without_llm_reads_models_from_stanza_resources_dir(
    make_memory: Any, database_url: str
) -> None:
    # stanza reads STANZA_RESOURCES_DIR when it is imported, hence a fresh interpreter.
    script = (
        "import sys\n"
        "from zerda_store import ConversationEntityMemory\n"
        "with ConversationEntityMemory(database_url=sys.argv[1], session_id='env') as memory:\n"
        f"    memory.save_context(*{ENGLISH_TURN!r})\n"
        "    print(memory.get_memory_stats()['extraction_errors'])\n"
    )
    env = dict(os.environ, STANZA_RESOURCES_DIR=str(MODELS), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", script, database_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"

    memory = make_memory(session_id="env")
    assert _types(memory, ["Sarah Connor", "Acme Corp", "Paris"]) == {
        "Sarah Connor": "PERSON",
        "Acme Corp": "ORG",
        "Paris": "GPE",
    }


def _models_dir(kind: str, root: Path) -> Path:
    """A resources folder that lacks the English models in one of three ways."""
    folder = root / kind
    folder.mkdir()
    if kind == "index-without-files":
        shutil.copyfile(MODELS / "resources.json", folder / "resources.json")
    elif kind == "index-without-english":
        resources = json.loads((MODELS / "resources.json").read_text("utf-8"))
        del resources["en"]
        (folder / "resources.json").write_text(json.dumps(resources), "utf-8")
    return folder


@pytest.mark.parametrize("kind", ["empty", "index-without-files", "index-without-english"])
def test_missing_model_fails_fast_offline_and_the_turns_are_kept(
    make_memory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    extractor = StanzaExtractor("en", stanza_dir=str(_models_dir(kind, tmp_path)))
    memory = make_memory(extractor=extractor)

    started = time.perf_counter()
    with caplog.at_level(logging.DEBUG, logger="zerda_store.extraction"):
        memory.save_context(*ENGLISH_TURN)
        memory.save_context({"input": "Did Sarah call you yesterday?"}, {"output": "No."})
    assert time.perf_counter() - started < 5

    stats = memory.get_memory_stats()
    assert stats["extraction_errors"] == 2
    assert stats["last_extraction_error"].startswith(
        "ModelNotAvailableError: stanza model for lang='en' is not available"
    )
    ours = [r for r in caplog.records if r.name == "zerda_store.extraction"]
    assert [r.levelno for r in ours] == [logging.ERROR, logging.DEBUG]
    assert (stats["message_count"], stats["entity_count"]) == (2, 0)
    assert memory.chat_memory[0]["input"] == ENGLISH_TURN[0]["input"]


def test_concurrent_first_calls_build_one_pipeline(
    make_memory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pipeline = stanza.Pipeline
    builds: list[dict[str, Any]] = []

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        builds.append(kwargs)
        time.sleep(0.2)  # widen the window in which a second build could start
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(stanza, "Pipeline", counting_pipeline)
    memory = make_memory(extractor=StanzaExtractor("en", stanza_dir=str(MODELS)))
    threads_count = 6
    start = threading.Barrier(threads_count)
    failures: list[BaseException] = []

    def save_turn() -> None:
        try:
            start.wait()
            memory.save_context(*ENGLISH_TURN)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=save_turn) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert failures == []
    assert len(builds) == 1
    assert builds[0]["download_method"] is None
    stats = memory.get_memory_stats()
    assert (stats["message_count"], stats["extraction_errors"]) == (threads_count, 0)
    assert memory.get_entity_info("Sarah Connor")["contexts_count"] == threads_count
