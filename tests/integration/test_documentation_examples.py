"""The examples of the original class's documentation, unchanged apart from the import and
a database URL, print what the original prints (with this project's recall header).

Example 5 is commented out in the documentation, so the original prints nothing for it; its
two lines run here in a process without any stanza model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from zerda_store import ConversationEntityMemory

REPO_ROOT = Path(__file__).resolve().parents[2]

EXAMPLE_5_UNCOMMENTED = """
import json, sys
from zerda_store import ConversationEntityMemory
mem3 = ConversationEntityMemory(lang="en", database_url=sys.argv[1])  # no llm -> stanza fallback
mem3.save_context({"input": "Barack Obama visited Paris."}, {"output": "Interesting!"})
print(json.dumps({"entities": mem3.list_entities(), "turns": list(mem3.chat_memory),
                  "stats": mem3.get_memory_stats()}))
"""


class FakeLLM:
    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        return "Sarah, Acme Corp"


def example_1_basic(database_url):
    mem = ConversationEntityMemory(llm=FakeLLM(), database_url=database_url)
    mem.save_context(
        {"input": "Sarah just joined Acme Corp as an engineer."},
        {"output": "Got it, noted!"},
    )
    return mem


def example_2_intermediate(mem):
    result = mem.load_memory_variables({"input": "What do we know about Sarah?"})
    print(result["entity_info"])


def example_3_advanced(mem):
    info = mem.get_entity_info("Sarah")
    print(info["contexts_count"], info["first_seen"])


def example_4_error_handling(database_url):
    class BrokenLLM:
        def generate(self, prompt, max_tokens=256):
            raise RuntimeError("timeout")

    mem2 = ConversationEntityMemory(llm=BrokenLLM(), database_url=database_url)
    mem2.save_context({"input": "Sarah again"}, {"output": "ok"})
    print(mem2.list_entities())  # [] — the error was logged, not raised
    return mem2


def test_example_1_saves_one_turn_with_both_entities(database_url):
    mem = example_1_basic(database_url)

    assert mem.list_entities() == ["Sarah", "Acme Corp"]
    assert list(mem.chat_memory) == [
        {
            "input": "Sarah just joined Acme Corp as an engineer.",
            "output": "Got it, noted!",
            "entities": ["Sarah", "Acme Corp"],
        }
    ]
    mem.close()


def test_example_2_prints_both_entities_with_the_english_header(database_url, capsys):
    mem = example_1_basic(database_url)

    example_2_intermediate(mem)

    assert capsys.readouterr().out == (
        "Previous information about Sarah:\n"
        "Sarah just joined Acme Corp as an engineer. Got it, noted!\n"
        "\n"
        "Previous information about Acme Corp:\n"
        "Sarah just joined Acme Corp as an engineer. Got it, noted!\n"
    )
    mem.close()


def test_example_3_prints_the_contexts_count_and_when_first_seen(database_url, capsys):
    before = time.time()
    mem = example_1_basic(database_url)
    after = time.time()

    example_3_advanced(mem)

    count, first_seen = capsys.readouterr().out.split()
    assert count == "1"
    assert before <= float(first_seen) <= after
    mem.close()


def test_example_4_prints_no_entities_and_does_not_raise(database_url, capsys):
    mem2 = example_4_error_handling(database_url)

    assert capsys.readouterr().out == "[]\n"
    assert mem2.get_memory_stats()["message_count"] == 1
    mem2.close()


def test_example_5_without_a_stanza_model_keeps_the_turn_and_counts_the_error(sqlite_url, tmp_path):
    environment = {**os.environ, "STANZA_RESOURCES_DIR": str(tmp_path / "no-models")}
    completed = subprocess.run(
        [sys.executable, "-c", EXAMPLE_5_UNCOMMENTED, sqlite_url],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    printed = json.loads(completed.stdout)
    assert printed["entities"] == []
    assert printed["turns"] == [
        {"input": "Barack Obama visited Paris.", "output": "Interesting!", "entities": []}
    ]
    assert printed["stats"]["extraction_errors"] == 1
    assert "stanza model" in printed["stats"]["last_extraction_error"]
    assert "stanza model" in completed.stderr
