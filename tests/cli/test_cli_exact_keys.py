"""The command line on a session written with exact-match keys (``normalize_names=False``):
it finds, shows and forgets entities by their exact spelling."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.doubles import KeywordLLM, say
from zerda_store import ConversationEntityMemory
from zerda_store.cli import main


def cli(database_url: str, *args: str):
    return CliRunner().invoke(main, ["--database-url", database_url, *args])


@pytest.fixture
def exact_keys(make_memory) -> ConversationEntityMemory:
    memory = make_memory(KeywordLLM(["Sarah", "Omar"]), session_id="s", normalize_names=False)
    say(memory, "Sarah joined", "first")
    say(memory, "Omar and Sarah met", "second")
    return memory


def test_cli_entity_finds_an_entity_of_a_session_written_with_exact_keys(exact_keys, database_url):
    result = cli(database_url, "entity", "Sarah", "--session", "s", "--json")

    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert (shown["name"], shown["contexts_count"]) == ("Sarah", 2)
    assert shown["recent_contexts"] == ["Sarah joined first", "Omar and Sarah met second"]

    other_spelling = cli(database_url, "entity", "sarah", "--session", "s")
    assert other_spelling.exit_code == 1
    assert "no entity 'sarah' in session 's'" in other_spelling.output


def test_cli_forget_erases_an_entity_of_a_session_written_with_exact_keys(exact_keys, database_url):
    result = cli(database_url, "forget", "--yes", "Sarah", "--session", "s", "--json")

    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "entity": "Sarah",
        "entities": 1,
        "contexts": 2,
        "turns_deleted": 0,
        "turns_updated": 2,
    }
    assert exact_keys.list_entities() == ["Omar"]
    assert [turn["entities"] for turn in exact_keys.chat_memory] == [[], ["Omar"]]


def test_cli_picks_the_exact_spelling_when_an_exact_key_session_holds_two(
    make_memory, database_url
):
    memory = make_memory(KeywordLLM(["sarah", "Sarah"]), session_id="s", normalize_names=False)
    say(memory, "sarah first")
    say(memory, "Sarah second")
    assert memory.list_entities() == ["sarah", "Sarah"]

    shown = cli(database_url, "entity", "Sarah", "--session", "s", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["recent_contexts"] == ["Sarah second ok"]

    forgotten = cli(database_url, "forget", "--yes", "Sarah", "--session", "s", "--json")
    assert forgotten.exit_code == 0, forgotten.output
    assert json.loads(forgotten.output)["entity"] == "Sarah"
    assert memory.list_entities() == ["sarah"]
