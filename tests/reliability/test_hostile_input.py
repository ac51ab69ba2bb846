"""Hostile and odd input: quotes, SQL fragments, LIKE wildcards, backslashes, RTL text,
emoji and combining marks round-trip exactly; NUL, lone surrogates and wrong types are
refused with nothing written; a turn of the largest size (1,000,000 characters) round-trips; passwords stay out of errors and
logs; an unreachable server fails within 10 s (SQLite and Postgres)."""

from __future__ import annotations

import logging
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.doubles import AnswerExtractor, NamesExtractor, RaisingExtractor, query, say
from tests.reliability.helpers import inspect_database, table_counts
from zerda_store import ConversationEntityMemory, DatabaseUnavailableError, Store
from zerda_store.model.names import name_key, without_ignorables

HOSTILE_NAMES = [
    'O\'Brien "Bobby" Tables',
    "'; DROP TABLE turns; --",
    "Robert'); DELETE FROM entities WHERE ('1'='1",
    "100% _match_ a\\b\\\\c",
    "%s %(name)s {name} {0} $1 ?",
    "سارة الأحمد",
    "مُحَمَّد عَلِيّ",
    "👩🏽‍💻 Dev Team 🇸🇦",
    "Zoe\u0308 A\u030angstro\u0308m",
    "\u202eevil RTL override",
    "NULL",
]
HOSTILE_INPUT = (
    'It\'s "quoted"; DROP TABLE turns; -- 50% off_ C:\\temp\\new\\x00 ‮ شكراً لك 🚀\r\n'
    "second line\twith a tab, and " + ", ".join(HOSTILE_NAMES)
)
HOSTILE_OUTPUT = "Sure — noted: ' \" ` ; -- /* */ %% \\ \\\\ ؟ 🎉 e\u0301"
SESSION_ID = "'; DROP TABLE entities; -- session"


@pytest.fixture
def memory(make_memory: Callable[..., ConversationEntityMemory]) -> ConversationEntityMemory:
    return make_memory(extractor=NamesExtractor(HOSTILE_NAMES), session_id=SESSION_ID)


def test_hostile_names_and_texts_round_trip_exactly(
    memory: ConversationEntityMemory, database_url: str
) -> None:
    memory.save_context({"input": HOSTILE_INPUT}, {"output": HOSTILE_OUTPUT})
    snippet = f"{HOSTILE_INPUT} {HOSTILE_OUTPUT}"

    assert list(memory.chat_memory) == [
        {"input": HOSTILE_INPUT, "output": HOSTILE_OUTPUT, "entities": HOSTILE_NAMES}
    ]
    assert memory.list_entities() == HOSTILE_NAMES
    for name in HOSTILE_NAMES:
        info = memory.get_entity_info(name)
        assert info is not None, name
        assert (info["name"], info["contexts_count"]) == (name, 1)
        assert info["recent_contexts"] == [snippet]
        assert memory.entity_store[name].contexts == [snippet]
    recalled = memory.load_memory_variables({"input": "who?"})["entity_info"]
    assert recalled == "\n\n".join(
        f"Previous information about {name}:\n{snippet}" for name in HOSTILE_NAMES
    )
    with inspect_database(database_url) as connection:
        assert table_counts(connection) == (1, len(HOSTILE_NAMES), len(HOSTILE_NAMES))


def test_a_name_is_found_by_any_form_with_the_same_key(memory: ConversationEntityMemory) -> None:
    memory.save_context({"input": HOSTILE_INPUT}, {"output": HOSTILE_OUTPUT})
    for other_form in ("ZOË ÅNGSTRÖM", "zoë  ångström", "محمد علي", "سارة الاحمد"):
        info = memory.get_entity_info(other_form)
        assert info is not None, other_form
        assert info["name"] in HOSTILE_NAMES  # the first form seen, not this one
        assert info["name"] != other_form


def test_names_of_256_code_points_are_kept_and_longer_ones_skipped(
    make_memory: Callable[..., ConversationEntityMemory],
) -> None:
    longest, too_long = "🚀" * 256, "é" * 257
    memory = make_memory(extractor=NamesExtractor([longest, too_long, "Ada"]))
    memory.save_context({"input": "launch"}, {"output": "ok"})
    assert memory.list_entities() == [longest, "Ada"]
    assert memory.chat_memory[0]["entities"] == [longest, "Ada"]


def test_the_session_id_is_only_a_value(
    make_memory: Callable[..., ConversationEntityMemory],
) -> None:
    hostile = make_memory(extractor=NamesExtractor(["Ada"]), session_id=SESSION_ID)
    plain = make_memory(extractor=NamesExtractor(["Ada"]), session_id="plain")
    hostile.save_context({"input": "a"}, {"output": "b"})
    plain.save_context({"input": "c"}, {"output": "d"})
    hostile.clear()
    assert len(hostile.chat_memory) == 0
    assert [turn["input"] for turn in plain.chat_memory] == ["c"]


# -- refused input ------------------------------------------------------------------

BAD_TEXTS = {"nul": "before\x00after", "lone surrogate": "before\ud800after"}


def _calls(memory: ConversationEntityMemory, text: str) -> dict[str, Callable[[], Any]]:
    def add_context() -> None:
        memory.entity_store["Ada"].add_context(text)

    return {
        "input": lambda: memory.save_context({"input": text}, {"output": "ok"}),
        "output": lambda: memory.save_context({"input": "ok"}, {"output": text}),
        "idempotency_key": lambda: memory.save_context(
            {"input": "ok"}, {"output": "ok"}, idempotency_key=text
        ),
        "bulk": lambda: memory.save_contexts(
            [({"input": "ok"}, {"output": "ok"})] * 2 + [({"input": text}, {"output": "ok"})]
        ),
        "add_context": add_context,
    }


def test_unstorable_text_is_a_value_error_and_nothing_is_written(
    make_memory: Callable[..., ConversationEntityMemory], database_url: str
) -> None:
    extractor = NamesExtractor(["Ada"])
    memory = make_memory(extractor=extractor)
    memory.save_context({"input": "Ada joined"}, {"output": "ok"})
    with inspect_database(database_url) as connection:
        before = table_counts(connection)

    for bad, text in BAD_TEXTS.items():
        for where, call in _calls(memory, text).items():
            calls_before = extractor.calls
            with pytest.raises(ValueError, match=r"NUL|surrogate"):
                call()
            with inspect_database(database_url) as connection:
                assert table_counts(connection) == before, (bad, where)
            if where in ("input", "output"):
                assert extractor.calls == calls_before, "refused before any model call"


def test_unstorable_text_in_a_query_or_name_lookup_is_refused(
    memory: ConversationEntityMemory,
) -> None:
    for text in BAD_TEXTS.values():
        with pytest.raises(ValueError):
            memory.load_memory_variables({"input": text})
        with pytest.raises(ValueError):
            memory.forget_entity(text)


NOT_STR = [42, 3.5, b"bytes", ["a", "list"], {"a": "dict"}, True]
NOT_MAPPINGS = [None, "a string", [("input", "x")], 7]


def test_a_value_that_is_not_a_str_is_a_type_error_naming_the_key(
    memory: ConversationEntityMemory, database_url: str
) -> None:
    for value in NOT_STR:
        with pytest.raises(TypeError, match=r"inputs\['input'\]"):
            memory.save_context({"input": value}, {"output": "ok"})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match=r"outputs\['output'\]"):
            memory.save_context({"input": "ok"}, {"output": value})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match=r"inputs\['input'\]"):
            memory.load_memory_variables({"input": value})  # type: ignore[dict-item]
    with inspect_database(database_url) as connection:
        assert table_counts(connection) == (0, 0, 0)


def test_arguments_that_are_not_mappings_are_type_errors(
    memory: ConversationEntityMemory, database_url: str
) -> None:
    for argument in NOT_MAPPINGS:
        with pytest.raises(TypeError, match="inputs must be a mapping"):
            memory.save_context(argument, {"output": "ok"})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="outputs must be a mapping"):
            memory.save_context({"input": "ok"}, argument)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="inputs must be a mapping"):
            memory.load_memory_variables(argument)  # type: ignore[arg-type]
    with inspect_database(database_url) as connection:
        assert table_counts(connection) == (0, 0, 0)


def test_missing_keys_and_none_are_empty_text(memory: ConversationEntityMemory) -> None:
    memory.save_context({"other": "x"}, {"output": None})
    assert memory.chat_memory[0] == {"input": "", "output": "", "entities": []}


def test_an_extracted_name_with_a_lone_surrogate_is_skipped_and_the_turn_kept(
    make_memory: Callable[..., ConversationEntityMemory], database_url: str
) -> None:
    memory = make_memory(extractor=NamesExtractor(["Good Name", "Bad\ud800Name"]))
    memory.save_context({"input": "hello"}, {"output": "there"})
    assert memory.list_entities() == ["Good Name"]
    assert memory.chat_memory[0]["entities"] == ["Good Name"]
    with inspect_database(database_url) as connection:
        assert table_counts(connection) == (1, 1, 1)


# -- size ---------------------------------------------------------------------------


def test_a_turn_of_the_largest_size_round_trips(
    make_memory: Callable[..., ConversationEntityMemory],
):
    """A million characters (the limit, docs/hardening.md H15) of mixed text: over 2 MB of
    UTF-8."""
    memory = make_memory(extractor=NamesExtractor(["Ada"]))
    block = "Ada signed 🚀 — عقد جديد; it's 100% done_\\ \n"
    big_input = (block * (1_000_000 // len(block) + 1))[:1_000_000]
    memory.save_context({"input": big_input}, {"output": "ok"})
    assert memory.chat_memory[0]["input"] == big_input
    info = memory.get_entity_info("Ada")
    assert info is not None
    assert info["recent_contexts"] == [f"{big_input} ok"]


# -- properties ---------------------------------------------------------------------

STORABLE_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=200)
NAMES = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cc",)), min_size=1, max_size=60
).filter(lambda name: name_key(name) != "")


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    with Store(database_url) as store:
        yield store


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(input_text=STORABLE_TEXT, output_text=STORABLE_TEXT, name=NAMES)
def test_any_storable_text_and_name_round_trip(
    store: Store, input_text: str, output_text: str, name: str
) -> None:
    memory = ConversationEntityMemory(
        extractor=NamesExtractor([name]), store=store, session_id=uuid.uuid4().hex
    )
    memory.save_context({"input": input_text}, {"output": output_text})
    turn = memory.chat_memory[0]
    assert (turn["input"], turn["output"]) == (input_text, output_text)
    snippet = f"{input_text} {output_text}"
    if not snippet.strip():
        assert turn["entities"] == []  # blank text extracts nothing
        return
    kept = without_ignorables(name)  # as extraction keeps a name: its ends stripped (H12)
    assert turn["entities"] == [kept]
    assert memory.list_entities() == [kept]
    info = memory.get_entity_info(kept)
    assert info is not None
    assert (info["name"], info["recent_contexts"]) == (kept, [snippet])


# -- connection errors ----------------------------------------------------------------

SECRET = "Sup3r$ecret/pa:ss@word"


def _url(port: int, database: str = "zerda", user: str = "zerda") -> str:
    url = sa.URL.create(
        "postgresql",
        username=user,
        password=SECRET,
        host="127.0.0.1",
        port=port,
        database=database,
    )
    return url.render_as_string(hide_password=False)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener.getsockname()[1]
    listener.close()


def _everything_said(error: BaseException) -> str:
    said = ["".join(traceback.format_exception(error))]
    seen: BaseException | None = error
    while seen is not None:
        said += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(said)


def _fail_to_open(url: str, caplog: pytest.LogCaptureFixture) -> tuple[BaseException, float]:
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        ConversationEntityMemory(database_url=url, auto_migrate=False)
    return raised.value, time.monotonic() - started


@pytest.mark.postgres
def test_a_missing_database_error_names_no_password(
    postgres_admin: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    url = _url(5432, database=f"zerda_missing_{uuid.uuid4().hex[:8]}", user="postgres")
    error, _ = _fail_to_open(url, caplog)
    assert isinstance(error, DatabaseUnavailableError)
    assert "does not exist" in str(error)
    assert "Sup3r" not in _everything_said(error)
    assert "Sup3r" not in caplog.text


@pytest.mark.parametrize("server", ["refused_port", "silent_server"])
def test_an_unreachable_server_fails_within_ten_seconds_without_the_password(
    request: pytest.FixtureRequest, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = request.getfixturevalue(server)
    error, elapsed = _fail_to_open(_url(port), caplog)
    assert isinstance(error, DatabaseUnavailableError)
    assert elapsed < 10
    assert f"zerda:***@127.0.0.1:{port}" in str(error)
    assert "Sup3r" not in _everything_said(error)
    assert "Sup3r" not in caplog.text


def test_a_store_shows_no_password() -> None:
    store = Store(_url(5432))
    try:
        assert "Sup3r" not in repr(store)
        assert "Sup3r" not in str(store)
    finally:
        store.close()


def ledger(database_url: str, session_id: str = "default") -> list[tuple[Any, ...]]:
    return query(
        database_url,
        "SELECT x.status, x.extractor, x.error FROM extractions x"
        " JOIN turns t ON t.session_id = x.session_id AND t.id = x.turn_id"
        " WHERE x.session_id = :s ORDER BY t.id",
        s=session_id,
    )[1]


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
