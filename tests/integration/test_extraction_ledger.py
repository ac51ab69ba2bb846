"""The extraction ledger and its repair: failed extractions lose nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from tests.doubles import BrokenLLM, KeywordLLM, OutageLLM, say
from zerda_store import StanzaExtractor
from zerda_store.cli import main
from zerda_store.db.store import core_of

MODELS = Path(__file__).resolve().parents[1] / "data" / "stanza"
NAMES = ("Sarah", "Acme Corp", "Berlin")


def _ledger(database_url: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return [
                tuple(row)
                for row in connection.execute(
                    sa.text(
                        "SELECT x.status, x.extractor, x.error, x.entity_count, x.attempts"
                        " FROM extractions x JOIN turns t"
                        " ON t.session_id = x.session_id AND t.id = x.turn_id ORDER BY t.id"
                    )
                )
            ]
    finally:
        engine.dispose()


def test_every_saved_turn_has_a_ledger_row(make_memory, database_url):
    memory = make_memory(KeywordLLM(NAMES))
    memory.save_context({"input": "Sarah joined Acme Corp"}, {"output": "ok"})
    memory.save_context({"input": "  "}, {"output": ""})
    memory.save_contexts([({"input": "Berlin office"}, {"output": "noted"})])
    rows = _ledger(database_url)
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        ("ok", "llm", 2, 1),
        ("skipped", "llm", 0, 1),
        ("ok", "llm", 1, 1),
    ]


def test_failed_extractions_are_recorded_and_the_turns_kept(make_memory, database_url):
    memory = make_memory(BrokenLLM(TimeoutError("LLM did not answer")))
    memory.save_context({"input": "Sarah joined Acme Corp"}, {"output": "ok"})
    assert len(memory.chat_memory) == 1
    assert _ledger(database_url) == [("failed", "llm", "TimeoutError: LLM did not answer", 0, 1)]


def test_reextract_repairs_failed_turns_in_turn_order_once(make_memory, database_url):
    llm = OutageLLM(NAMES, down=True)
    memory = make_memory(llm)
    memory.save_context({"input": "Sarah joined Acme Corp"}, {"output": "first"})
    memory.save_context({"input": "Sarah moved to Berlin"}, {"output": "second"})
    llm.down = False
    memory.save_context({"input": "Sarah is happy"}, {"output": "third"})
    assert memory.list_entities() == ["Sarah"]

    assert memory.reextract() == {"repaired": 2, "failed": 0}
    assert memory.reextract() == {"repaired": 0, "failed": 0}

    # as if extraction had worked the first time: order, snippets, display names, turns
    assert memory.list_entities() == ["Sarah", "Acme Corp", "Berlin"]
    assert memory.entity_store["Sarah"].contexts == [
        "Sarah joined Acme Corp first",
        "Sarah moved to Berlin second",
        "Sarah is happy third",
    ]
    assert [turn["entities"] for turn in memory.chat_memory] == [
        ["Sarah", "Acme Corp"],
        ["Sarah", "Berlin"],
        ["Sarah"],
    ]
    assert memory.get_memory_stats()["total_contexts"] == 5
    assert [row[0] for row in _ledger(database_url)] == ["ok", "ok", "ok"]
    assert [row[4] for row in _ledger(database_url)] == [2, 2, 1]


def test_reextract_while_still_failing_counts_the_attempt(make_memory, database_url):
    memory = make_memory(BrokenLLM())
    memory.save_context({"input": "Sarah"}, {"output": "x"})
    assert memory.reextract() == {"repaired": 0, "failed": 1}
    assert _ledger(database_url)[0][0::4] == ("failed", 2)


def test_the_llm_is_never_called_while_a_connection_is_held(make_memory):
    held: list[int] = []

    class WatchingLLM(KeywordLLM):
        def generate(self, prompt: str, max_tokens: int = 256) -> str:
            held.append(core_of(memory.store).connections_in_use())
            return super().generate(prompt, max_tokens)

    memory = make_memory(WatchingLLM(NAMES))
    memory.save_context({"input": "Sarah joined Acme Corp"}, {"output": "ok"})
    memory.save_context({"input": "Sarah"}, {"output": "again"}, idempotency_key="m-1")
    memory.save_contexts([({"input": "Berlin"}, {"output": "x"})])
    memory.load_memory_variables({"input": "Sarah?"})
    assert len(held) == 4
    assert held and held == [0] * len(held)


def test_cli_reextract_repairs_turns_once_stanza_models_are_present(
    make_memory, database_url, tmp_path
):
    pytest.importorskip("stanza")
    empty = tmp_path / "no-models"
    empty.mkdir()
    memory = make_memory(extractor=StanzaExtractor("en", stanza_dir=str(empty)), session_id="s1")
    memory.save_context({"input": "Sarah Connor joined Acme Corp in Paris."}, {"output": "Noted."})
    assert memory.list_entities() == []
    assert memory.get_memory_stats()["extraction_errors"] == 1

    args = ["--database-url", database_url, "reextract", "--failed", "--session", "s1"]
    result = CliRunner().invoke(main, [*args, "--stanza-dir", str(MODELS)])
    assert result.exit_code == 0, result.output
    assert "repaired 1 turn," in result.output
    again = CliRunner().invoke(main, [*args, "--stanza-dir", str(MODELS)])
    assert "repaired 0 turns" in again.output

    assert memory.list_entities() == ["Sarah Connor", "Acme Corp", "Paris"]
    assert memory.get_entity_info("Sarah Connor")["type"] == "PERSON"
    assert memory.get_memory_stats()["total_contexts"] == 3


def test_a_repaired_older_turn_gives_the_display_name_first_seen_and_order(make_memory, clock):
    llm = OutageLLM(["sarah", "Sarah", "Omar"])
    memory = make_memory(llm, clock=clock)
    llm.down = True
    say(memory, "sarah called about the quote", "first")  # at 1000, extraction fails
    llm.down = False
    say(memory, "Omar met Sarah", "second")  # at 1100
    assert memory.list_entities() == ["Omar", "Sarah"]
    assert memory.get_entity_info("sarah")["first_seen"] == 1100.0

    assert memory.reextract() == {"repaired": 1, "failed": 0}

    assert memory.list_entities() == ["sarah", "Omar"]
    assert list(memory.entity_store) == ["sarah", "Omar"]
    info = memory.get_entity_info("SARAH")
    assert info["name"] == "sarah"
    assert (info["first_seen"], info["last_seen"]) == (1000.0, 1100.0)
    assert info["recent_contexts"] == [
        "sarah called about the quote first",
        "Omar met Sarah second",
    ]
    assert memory.entity_store["Sarah"].name == "sarah"
    assert memory.load_memory_variables({"input": "What about Sarah?"})["entity_info"] == (
        "Previous information about sarah:\n"
        "sarah called about the quote first\nOmar met Sarah second"
    )
    assert [turn["entities"] for turn in memory.chat_memory] == [["sarah"], ["Omar", "Sarah"]]
