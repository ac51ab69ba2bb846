"""The fixes of the last review, one test per behaviour, on SQLite and on Postgres where the
behaviour touches the database."""

from __future__ import annotations

import itertools
import json
import sys
import traceback
import types
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import zerda_store.extraction as extraction_module
import zerda_store.memory.conversation as memory_module
from tests.support import FixedLLM, KeywordLLM
from zerda_store import (
    ConversationEntityMemory,
    SchemaNotCurrentError,
    StanzaExtractor,
    Store,
    StoreError,
    migrate,
)
from zerda_store.cli import main
from zerda_store.db.engine import DATABASE_URL_ENV

OVERVIEW_COLUMNS = [
    "session_id",
    "name",
    "entity_type",
    "contexts_count",
    "first_seen",
    "last_seen",
    "last_context",
]


def say(memory, said, answered="ok"):
    memory.save_context({"input": said}, {"output": answered})


def query(database_url: str, sql: str, **params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of one statement, on a connection of its own."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            result = connection.execute(sa.text(sql), params)
            return list(result.keys()), [tuple(row) for row in result]
    finally:
        engine.dispose()


def execute(database_url: str, sql: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text(sql))
    finally:
        engine.dispose()


def ledger(database_url: str, session_id: str = "default") -> list[tuple[Any, ...]]:
    return query(
        database_url,
        "SELECT x.status, x.extractor, x.error FROM extractions x"
        " JOIN turns t ON t.session_id = x.session_id AND t.id = x.turn_id"
        " WHERE x.session_id = :s ORDER BY t.id",
        s=session_id,
    )[1]


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The memory's clock ticks 100 s per reading from 1000.0; returns the readings taken."""
    ticks = itertools.count(1000.0, 100.0)
    readings: list[float] = []

    def now() -> float:
        readings.append(next(ticks))
        return readings[-1]

    monkeypatch.setattr(memory_module, "time", types.SimpleNamespace(time=now))
    return readings


class OutageExtractor:
    """Finds the known names (case-sensitive) with their types, in order of first
    occurrence; raises while ``down`` is set, like a provider during an outage."""

    name = "typed"

    def __init__(self, types_by_name: dict[str, str]) -> None:
        self.types_by_name = types_by_name
        self.down = False

    def extract(self, text: str) -> list[tuple[str, str]]:
        if self.down:
            raise TimeoutError("extraction did not answer in 30 s")
        found = sorted((text.find(name), name) for name in self.types_by_name if name in text)
        return [(name, self.types_by_name[name]) for _, name in found]


class OutageLLM(KeywordLLM):
    """A keyword LLM that fails while ``down`` is set."""

    def __init__(self, vocabulary) -> None:
        super().__init__(vocabulary)
        self.down = False

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        if self.down:
            raise TimeoutError("LLM did not answer in 30 s")
        return super().generate(prompt, max_tokens)


# -- 1. database URLs that cannot work ------------------------------------------------------


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused_with_a_clear_error(url):
    with pytest.raises(StoreError, match="in-memory SQLite") as caught:
        Store(url)
    assert "use a file" in str(caught.value)

    with pytest.raises(StoreError, match="use a file"):
        ConversationEntityMemory(database_url=url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://u:s3cret@db.example/crm", "unsupported database 'mysql'"),
        ("postgresql+psycopg2://u:s3cret@db.example/crm", "the psycopg2 driver is not supported"),
        ("postgresql://u:s3cret@db.example:abc/crm", "could not parse the database URL"),
    ],
)
def test_an_unsupported_or_malformed_url_is_a_store_error_without_the_password(url, expected):
    with pytest.raises(StoreError) as caught:
        Store(url)

    error = caught.value
    assert expected in str(error)
    assert "s3cret" not in str(error)
    assert "s3cret" not in repr(error)
    assert "s3cret" not in "".join(traceback.format_exception(error))


def test_a_non_numeric_port_is_refused_before_any_connection_is_tried():
    with pytest.raises(StoreError, match="could not parse"):
        ConversationEntityMemory(database_url="postgresql://u:pw@127.0.0.1:abc/crm")


# -- 2. a schema from a newer version -------------------------------------------------------


@pytest.mark.parametrize("auto_migrate", [None, True])
def test_a_schema_migrated_by_a_newer_version_is_refused_and_left_alone(
    database_url, auto_migrate, monkeypatch
):
    execute(database_url, "UPDATE alembic_version SET version_num = '9999'")

    def no_upgrade(*_: object, **__: object) -> None:
        raise AssertionError("a schema from a newer version must not be migrated")

    monkeypatch.setattr(migrate, "upgrade", no_upgrade)

    with pytest.raises(SchemaNotCurrentError) as caught:
        ConversationEntityMemory(database_url=database_url, auto_migrate=auto_migrate)

    message = str(caught.value)
    assert "9999" in message
    assert "migrated by a newer version" in message
    assert query(database_url, "SELECT version_num FROM alembic_version")[1] == [("9999",)]


# -- 3. the inspection views ------------------------------------------------------------------


def overview(database_url: str, session_id: str = "default"):
    return query(
        database_url,
        "SELECT * FROM entity_overview WHERE session_id = :s ORDER BY name",
        s=session_id,
    )


def snippets(database_url: str, session_id: str = "default") -> list[tuple[Any, ...]]:
    return query(
        database_url,
        "SELECT name, recency, text FROM entity_snippets WHERE session_id = :s"
        " ORDER BY name, recency",
        s=session_id,
    )[1]


def test_entity_overview_has_exactly_its_columns_and_the_right_values(
    make_memory, database_url, clock
):
    extractor = OutageExtractor({"Sarah": "PERSON", "Acme Corp": "ORG"})
    memory = make_memory(extractor=extractor)
    other = make_memory(extractor=extractor, session_id="other")
    say(memory, "Sarah joined Acme Corp", "first")  # at 1000
    say(memory, "Sarah called", "second")  # at 1100
    say(other, "Acme Corp elsewhere")  # at 1200

    columns, rows = overview(database_url)

    assert columns == OVERVIEW_COLUMNS
    assert rows == [
        ("default", "Acme Corp", "ORG", 1, 1000.0, 1000.0, "Sarah joined Acme Corp first"),
        ("default", "Sarah", "PERSON", 2, 1000.0, 1100.0, "Sarah called second"),
    ]
    assert overview(database_url, "other")[1] == [
        ("other", "Acme Corp", "ORG", 1, 1200.0, 1200.0, "Acme Corp elsewhere ok"),
    ]


def test_entity_overview_last_context_is_a_note_added_to_the_entity(
    make_memory, database_url, clock
):
    memory = make_memory(FixedLLM("Sarah"))
    say(memory, "Sarah one")  # at 1000
    say(memory, "Sarah two")  # at 1100

    memory.entity_store["Sarah"].add_context("a note about Sarah")  # at 1200

    assert overview(database_url)[1] == [
        ("default", "Sarah", "unknown", 3, 1000.0, 1200.0, "a note about Sarah"),
    ]
    assert snippets(database_url) == [
        ("Sarah", 1, "a note about Sarah"),
        ("Sarah", 2, "Sarah two ok"),
        ("Sarah", 3, "Sarah one ok"),
    ]


def test_entity_overview_keeps_the_latest_snippet_after_an_older_turn_is_repaired(
    make_memory, database_url, clock
):
    extractor = OutageExtractor({"Sarah": "PERSON", "Omar": "PERSON"})
    memory = make_memory(extractor=extractor)
    extractor.down = True
    say(memory, "Sarah and Omar met", "old")  # at 1000, extraction fails
    extractor.down = False
    say(memory, "Sarah called", "new")  # at 1100

    assert memory.reextract() == {"repaired": 1, "failed": 0}

    assert overview(database_url)[1] == [
        ("default", "Omar", "PERSON", 1, 1000.0, 1000.0, "Sarah and Omar met old"),
        ("default", "Sarah", "PERSON", 2, 1000.0, 1100.0, "Sarah called new"),
    ]
    assert snippets(database_url) == [
        ("Omar", 1, "Sarah and Omar met old"),
        ("Sarah", 1, "Sarah called new"),
        ("Sarah", 2, "Sarah and Omar met old"),
    ]


def test_entity_snippets_ranks_each_entitys_snippets_newest_first_from_one(
    make_memory, database_url
):
    memory = make_memory(KeywordLLM(["Sarah", "Omar"]))
    other = make_memory(KeywordLLM(["Sarah"]), session_id="other")
    say(memory, "Sarah one")
    say(other, "Sarah elsewhere")
    say(memory, "Omar one")
    say(memory, "Sarah and Omar")
    say(memory, "Sarah three")

    assert snippets(database_url) == [
        ("Omar", 1, "Sarah and Omar ok"),
        ("Omar", 2, "Omar one ok"),
        ("Sarah", 1, "Sarah three ok"),
        ("Sarah", 2, "Sarah and Omar ok"),
        ("Sarah", 3, "Sarah one ok"),
    ]
    assert snippets(database_url, "other") == [("Sarah", 1, "Sarah elsewhere ok")]


# -- 4. a repaired older turn is the entity's first sighting -------------------------------


def test_a_repaired_older_turn_gives_the_display_name_first_seen_and_order(make_memory, clock):
    llm = OutageLLM(["sarah", "Sarah", "Omar"])
    memory = make_memory(llm)
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


# -- 5. where the constructor finds its database ----------------------------------------------


def test_without_a_database_url_the_environment_variable_is_used(
    database_url, monkeypatch, tmp_path
):
    monkeypatch.setenv(DATABASE_URL_ENV, database_url)
    monkeypatch.chdir(tmp_path)

    with ConversationEntityMemory(FixedLLM("Sarah"), session_id="env") as memory:
        say(memory, "Sarah joined")

    assert not (tmp_path / "zerda_store.db").exists()
    monkeypatch.delenv(DATABASE_URL_ENV)
    with ConversationEntityMemory(database_url=database_url, session_id="env") as reopened:
        assert reopened.list_entities() == ["Sarah"]
        assert [turn["input"] for turn in reopened.chat_memory] == ["Sarah joined"]


def test_without_url_or_environment_the_sqlite_file_in_the_working_folder_is_used(
    monkeypatch, tmp_path
):
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    monkeypatch.chdir(tmp_path)

    with ConversationEntityMemory(FixedLLM("Sarah")) as memory:
        assert memory.store.url.get_backend_name() == "sqlite"
        say(memory, "Sarah joined")

    assert (tmp_path / "zerda_store.db").is_file()
    with ConversationEntityMemory(
        database_url=f"sqlite:///{tmp_path / 'zerda_store.db'}"
    ) as reopened:
        assert reopened.list_entities() == ["Sarah"]


def test_a_store_and_a_database_url_together_are_a_value_error(database_url):
    with Store(database_url) as store:
        with pytest.raises(ValueError, match="either database_url or store"):
            ConversationEntityMemory(store=store, database_url=database_url)
        assert not store.closed


# -- 6. the command line on a session with exact-match keys -----------------------------------


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
    result = cli(database_url, "forget", "Sarah", "--session", "s", "--json")

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

    forgotten = cli(database_url, "forget", "Sarah", "--session", "s", "--json")
    assert forgotten.exit_code == 0, forgotten.output
    assert json.loads(forgotten.output)["entity"] == "Sarah"
    assert memory.list_entities() == ["sarah"]


# -- 7. extractor output that no database can store ---------------------------------------------


class RaisingExtractor:
    name = "raising"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def extract(self, text: str) -> list[str]:
        raise self.error


class AnswerExtractor:
    def __init__(self, answer, name: str = "answer") -> None:
        self.answer = answer
        self.name = name

    def extract(self, text: str):
        return self.answer


@pytest.mark.parametrize("bad_type", ["ORG\x00", "ORG\ud800", "\x00"])
def test_an_entity_type_that_cannot_be_stored_becomes_unknown(make_memory, bad_type):
    memory = make_memory(extractor=AnswerExtractor([("Acme", bad_type), ("Sarah", "PERSON")]))

    say(memory, "Acme hired Sarah")

    assert memory.list_entities() == ["Acme", "Sarah"]
    assert memory.get_entity_info("Acme")["type"] == "unknown"
    assert memory.entity_store["Acme"].entity_type == "unknown"
    assert memory.get_entity_info("Sarah")["type"] == "PERSON"
    assert list(memory.chat_memory) == [
        {"input": "Acme hired Sarah", "output": "ok", "entities": ["Acme", "Sarah"]}
    ]
    assert memory.get_memory_stats()["extraction_errors"] == 0


@pytest.mark.parametrize(
    ("message", "stored"),
    [
        ("bad\x00byte", "RuntimeError: bad\\x00byte"),
        ("lone \ud800 surrogate", "RuntimeError: lone \\ud800 surrogate"),
    ],
)
def test_an_extraction_error_holding_nul_or_a_surrogate_is_escaped_and_recorded(
    make_memory, database_url, message, stored
):
    memory = make_memory(extractor=RaisingExtractor(RuntimeError(message)))

    say(memory, "Acme hired Sarah")

    assert list(memory.chat_memory) == [
        {"input": "Acme hired Sarah", "output": "ok", "entities": []}
    ]
    stats = memory.get_memory_stats()
    assert (stats["message_count"], stats["extraction_errors"]) == (1, 1)
    assert stats["last_extraction_error"] == stored
    assert "\x00" not in stats["last_extraction_error"]
    stats["last_extraction_error"].encode("utf-8")  # no lone surrogate left
    assert ledger(database_url) == [("failed", "raising", stored)]


def test_an_extractor_name_holding_nul_is_escaped_in_the_ledger(make_memory, database_url):
    memory = make_memory(extractor=AnswerExtractor(["Acme"], name="odd\x00name"))

    say(memory, "Acme")

    assert memory.list_entities() == ["Acme"]
    assert ledger(database_url) == [("ok", "odd\\x00name", None)]


# -- 8. forgetting with turns also removes failed turns that mention the name -----------------


def test_forget_with_turns_deletes_failed_turns_that_mention_the_name(make_memory):
    llm = OutageLLM(["Jane Doe", "Omar"])
    memory = make_memory(llm)
    llm.down = True
    say(memory, "Jane Doe called about the invoice", "failed 1")
    say(memory, "Omar phoned", "failed 2")
    llm.down = False
    say(memory, "Jane Doe signed the contract", "good 1")
    say(memory, "Omar asked about pricing", "good 2")
    assert memory.list_entities() == ["Jane Doe", "Omar"]

    receipt = memory.forget_entity("Jane Doe", with_turns=True)

    assert receipt == {
        "entity": "Jane Doe",
        "entities": 1,
        "contexts": 1,
        "turns_deleted": 2,
        "turns_updated": 0,
    }
    assert [turn["output"] for turn in memory.chat_memory] == ["failed 2", "good 2"]

    assert memory.reextract() == {"repaired": 1, "failed": 0}

    assert memory.list_entities() == ["Omar"]
    assert "Jane Doe" not in memory.entity_store
    assert memory.get_entity_info("Jane Doe") is None
    assert memory.get_entity_info("Omar")["recent_contexts"] == [
        "Omar phoned failed 2",
        "Omar asked about pricing good 2",
    ]
    assert [turn["entities"] for turn in memory.chat_memory] == [["Omar"], ["Omar"]]


def test_forget_with_turns_keeps_failed_turns_where_the_name_is_only_part_of_a_word(
    make_memory,
):
    llm = OutageLLM(["Ann"])
    memory = make_memory(llm)
    say(memory, "Ann joined", "good")
    llm.down = True
    say(memory, "The annual report is due on Friday", "failed")

    receipt = memory.forget_entity("Ann", with_turns=True)

    assert receipt["turns_deleted"] == 1
    assert [turn["output"] for turn in memory.chat_memory] == ["failed"]


def test_forget_without_turns_leaves_failed_turns_in_place(make_memory):
    llm = OutageLLM(["Jane Doe"])
    memory = make_memory(llm)
    llm.down = True
    say(memory, "Jane Doe called", "failed")
    llm.down = False
    say(memory, "Jane Doe signed", "good")

    receipt = memory.forget_entity("Jane Doe")

    assert (receipt["turns_deleted"], receipt["turns_updated"]) == (0, 1)
    assert [turn["output"] for turn in memory.chat_memory] == ["failed", "good"]


# -- 9. negative indexes of chat_memory -------------------------------------------------------


def test_chat_memory_negative_indexes_count_from_the_newest_turn(make_memory):
    memory = make_memory(KeywordLLM(["Sarah"]), session_id="mine")
    other = make_memory(KeywordLLM(["Sarah"]), session_id="theirs")
    with pytest.raises(IndexError):
        memory.chat_memory[-1]
    say(memory, "one")
    say(other, "theirs one")
    say(memory, "two Sarah")
    say(memory, "three")
    say(other, "theirs two")

    assert memory.chat_memory[-1] == {"input": "three", "output": "ok", "entities": []}
    assert memory.chat_memory[-2] == {"input": "two Sarah", "output": "ok", "entities": ["Sarah"]}
    assert memory.chat_memory[-3]["input"] == "one"
    assert memory.chat_memory[-3] == memory.chat_memory[0]
    with pytest.raises(IndexError):
        memory.chat_memory[-len(memory.chat_memory) - 1]
    with pytest.raises(IndexError):
        memory.chat_memory[-100]
    assert other.chat_memory[-1]["input"] == "theirs two"


# -- 10. one stanza pipeline per process ------------------------------------------------------


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
