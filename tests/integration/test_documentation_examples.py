"""The examples of the original class's documentation, unchanged apart from the import and
a database URL, print what the original prints (with this project's recall header); and
every Python block of the README and docs/*.md runs as written (see markdown_blocks.py).

Example 5 is commented out in the documentation, so the original prints nothing for it; its
two lines run here in a process without any stanza model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.markdown_blocks import DOCUMENTS, python_blocks, run_block
from zerda_store import ConversationEntityMemory, Store, migrate

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


# -- every Python block of the README and docs/*.md ---------------------------------------

BLOCKS = python_blocks()
RUNNABLE = [b for b in BLOCKS if b.reason_not_runnable is None]
ON_THE_DEFAULT_FILE = [b for b in RUNNABLE if not b.uses_a_url]
WITH_A_URL = [b for b in RUNNABLE if b.uses_a_url]
SERVICE = "app = FastAPI(lifespan=lifespan)"

# Drives the README's FastAPI app, appended to its block: a turn, the same message again (a
# retry whose response was lost), then a question about what the first turn stored.
SERVICE_CLIENT = """
import json
from fastapi.testclient import TestClient
with TestClient(app) as client:
    turn = {"customer_id": "c-1", "message_id": "m-1", "text": "Sarah joined Acme Corp."}
    first = client.post("/chat", json=turn).json()
    again = client.post("/chat", json=turn).json()
    asked = {"customer_id": "c-1", "message_id": "m-2", "text": "What about Sarah?"}
    answer = client.post("/chat", json=asked).json()["answer"]
with Store(os.environ["ZERDA_STORE_DATABASE_URL"]) as check:
    stored = ConversationEntityMemory(store=check, session_id="c-1").get_memory_stats()
print(json.dumps({"first": first, "again": again, "answer": answer, "turns": stored["message_count"]}))
"""


def test_every_block_that_cannot_run_alone_says_why():
    marked = [b for b in BLOCKS if b.reason_not_runnable is not None]

    assert BLOCKS, "no Python blocks found in the README"
    for block in marked:
        assert len(block.reason_not_runnable or "") > 10, f"{block}: give the reason"
    assert any(SERVICE in b.code for b in RUNNABLE), "the service example is not run"


def assert_ran_as_documented(block, result) -> None:
    assert result.returncode == 0, f"{block}:\n{result.stderr}"
    for expected in block.expected_output():
        assert expected in result.stdout, f"{block} should print {expected!r}:\n{result.stdout}"


@pytest.mark.parametrize("block", ON_THE_DEFAULT_FILE, ids=str)
def test_a_block_without_a_url_runs_as_written_on_the_default_file(block, tmp_path):
    result = run_block(block.code, tmp_path, None)

    assert_ran_as_documented(block, result)
    if "ConversationEntityMemory(" in block.code:  # it stored something, in the default file
        assert (tmp_path / "zerda_store.db").is_file()


@pytest.mark.parametrize("block", WITH_A_URL, ids=str)
def test_a_block_with_a_url_runs_as_written_on_each_backend(block, empty_database_url, tmp_path):
    if not block.creates_the_schema:  # as the README says: `zerda-store db upgrade` first
        with Store(empty_database_url) as store:
            migrate.upgrade(store)
    code = block.code + (SERVICE_CLIENT if SERVICE in block.code else "")

    result = run_block(code, tmp_path, empty_database_url)

    assert_ran_as_documented(block, result)
    assert not (tmp_path / "zerda_store.db").exists() or empty_database_url.startswith("sqlite")
    if SERVICE in block.code:
        printed = json.loads(result.stdout.splitlines()[-1])
        assert printed["first"]["answer"] == "Noted. Known so far: nothing"
        assert "Previous information about Sarah:" in printed["answer"]
        assert printed["turns"] == 2  # the retried message was stored once


def test_the_readme_quick_start_runs_what_ci_runs():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    ci_commands = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()

    assert "scripts/test" in ci_commands
    for command in ("scripts/demo", "scripts/test"):
        assert f"\n{command} " in quick_start
        assert os.access(REPO_ROOT / command, os.X_OK), command


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a document's headings."""
    headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.name)
def test_every_link_between_the_documents_leads_somewhere(document):
    text = document.read_text(encoding="utf-8")
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        assert linked.exists(), f"{document.name} links to {target}, which is not there"
        if anchor:
            anchors = heading_anchors(linked.read_text(encoding="utf-8"))
            assert anchor in anchors, f"{document.name} links to {target}: no such heading"


def test_the_readme_links_every_document_in_docs():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")

    for document in sorted((REPO_ROOT / "docs").glob("*.md")):
        assert f"](docs/{document.name})" in readme, f"the README does not link {document.name}"
