"""The input rules (docs/hardening.md): every number and stored name the API takes has one
range or shape, the same on both backends, and a value outside it is refused in one line
before anything is written (never a driver's OverflowError or DataError)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.doubles import KeywordLLM
from zerda_store import Store, StoreError
from zerda_store.errors import MergeError

BIGINT = 2**63 - 1
INTEGER = 2**31 - 1


@pytest.fixture
def memory(make_memory):
    made = make_memory(llm=KeywordLLM(["Sarah Chen", "Acme Corp"]), session_id="s1")
    made.save_context({"input": "Sarah Chen works at Acme Corp."}, {"output": "ok"})
    return made


def refused(call, error: type[Exception] = ValueError) -> str:
    """The one-line message of a refusal that is not a database error."""
    with pytest.raises(error) as raised:
        call()
    assert not isinstance(raised.value, StoreError) or isinstance(raised.value, MergeError)
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("keep_last", [2**31, 2**63, 10**20, 0, -1])
def test_keep_last_beyond_a_32_bit_count_is_refused_on_both_backends(memory, keep_last):
    message = refused(lambda: memory.set_retention(keep_last=keep_last))
    assert "keep_last" in message and f"{INTEGER:,}" in message
    assert memory.get_retention()["source"] is None


def test_the_largest_keep_last_is_stored_on_both_backends(memory):
    memory.set_retention(keep_last=INTEGER)
    assert memory.get_retention()["keep_last"] == INTEGER


@pytest.mark.parametrize("value", [True, False, "90", float("nan"), float("inf"), 1e300, -5])
def test_a_duration_that_is_not_a_positive_number_of_seconds_is_refused(memory, value):
    for field in ("max_age", "session_idle"):
        message = refused(lambda field=field: memory.set_retention(**{field: value}))
        assert field in message
    assert memory.get_retention()["source"] is None


def test_durations_as_timedelta_or_seconds_are_stored(memory):
    memory.set_retention(max_age=timedelta(days=90), session_idle=3600)
    shown = memory.get_retention()
    assert (shown["max_age"], shown["session_idle"]) == (90 * 86400.0, 3600.0)


@pytest.mark.parametrize(
    "entity_type",
    ["", "x" * 65, "x" * 300, "PER\x1bSON", "ORG\x07", "a\nb", "\x85", 5],
)
def test_an_entity_type_outside_the_schemas_length_or_with_control_characters_is_refused(
    memory, entity_type
):
    error: type[Exception] = TypeError if not isinstance(entity_type, str) else ValueError
    message = refused(lambda: memory.set_retention(keep_last=2, entity_type=entity_type), error)
    assert "entity_type" in message
    refused(lambda: memory.clear_retention(entity_type=entity_type), error)
    assert memory.get_retention()["source"] is None


def test_an_entity_type_of_the_schemas_length_is_stored(memory):
    memory.set_retention(keep_last=2, entity_type="T" * 64)
    assert memory.get_retention()["by_type"] == {
        "T" * 64: {"keep_last": 2, "max_age": None, "session_idle": None}
    }
    assert memory.clear_retention(entity_type="T" * 64) == 1


@pytest.mark.parametrize("merge_id", [2**63, 10**30, 0, -1])
def test_a_merge_id_outside_the_id_range_is_a_merge_error(memory, merge_id):
    message = refused(lambda: memory.unmerge(merge_id), MergeError)
    assert "merge_id" in message


def test_the_largest_merge_id_is_looked_up_and_not_found(memory):
    message = refused(lambda: memory.unmerge(BIGINT), MergeError)
    assert str(BIGINT) in message


@pytest.mark.parametrize("limit", [2**31, 2**63, 10**20])
def test_a_recent_contexts_limit_beyond_32_bits_is_refused(memory, limit):
    entity = memory.entity_store["Sarah Chen"]
    message = refused(lambda: entity.get_recent_contexts(limit))
    assert "limit" in message


def test_a_chat_memory_index_beyond_64_bits_is_out_of_range(memory):
    for index in (2**63, -(2**63), 10**30, -(10**30)):
        with pytest.raises(IndexError):
            memory.chat_memory[index]
    assert memory.chat_memory[2**63 : 2**64] == []


@pytest.mark.parametrize(
    "alias",
    ["y" * 257, "y" * 10_000, "Sa\x1brah", "Sarah\x07", "Sa\x9brah", "Sa\nrah", ""],
)
def test_add_alias_refuses_a_name_no_path_could_store(memory, alias):
    message = refused(lambda: memory.add_alias("Sarah Chen", alias))
    assert "alias" in message
    assert memory.aliases() == []


def test_add_alias_takes_a_name_of_the_schemas_length(memory):
    alias = "Sarah " + "y" * 250
    assert memory.add_alias("Sarah Chen", alias)
    assert [a["alias"] for a in memory.aliases()] == [alias]


ID_TABLES = ("turns", "entities", "contexts", "entity_aliases", "entity_merges", "extractions")


def _ids_start_past_32_bits(url: str) -> None:
    """Make every table's next id 2**40 (as a long-lived database reaches)."""
    with Store(url) as store, store.connect() as connection, connection.begin():
        for table in ID_TABLES:
            if connection.dialect.name == "postgresql":
                connection.exec_driver_sql(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {2**40})"
                )
            else:
                connection.exec_driver_sql(f"DELETE FROM sqlite_sequence WHERE name = '{table}'")
                connection.exec_driver_sql(
                    f"INSERT INTO sqlite_sequence (name, seq) VALUES ('{table}', {2**40})"
                )


def test_ids_past_32_bits_work_on_every_path_of_both_backends(database_url, make_memory):
    _ids_start_past_32_bits(database_url)
    memory = make_memory(llm=KeywordLLM(["Sarah Chen", "Acme Corp", "Sarah"]), session_id="s1")
    memory.save_context({"input": "Sarah Chen works at Acme Corp."}, {"output": "ok"})
    memory.save_context({"input": "Sarah called."}, {"output": "ok"})
    assert memory.add_alias("Sarah Chen", "SC")
    merged = memory.merge_entities("Sarah Chen", "Sarah")
    # (SQLite's merge log has no AUTOINCREMENT, so its ids start at 1 there.)
    assert merged["merge_id"] > 2**40 or database_url.startswith("sqlite")
    assert memory.entity_store["Sarah Chen"]._id > 2**40
    memory.unmerge(merged["merge_id"])
    memory.entity_store["Acme Corp"].add_context("Acme prefers email.")
    assert memory.entity_store["Acme Corp"].get_recent_contexts(1) == ["Acme prefers email."]
    assert memory.remove_alias("SC")
    receipt = memory.forget_entity("Sarah Chen", with_turns=True)
    assert receipt["turns_deleted"] == 1
    assert memory.list_entities() == ["Acme Corp", "Sarah"]


@pytest.mark.parametrize("limit", [0, -1, 2**31, True])
def test_a_similar_entities_limit_outside_the_count_range_is_refused(memory, limit):
    assert "limit" in refused(lambda: memory.similar_entities(limit=limit))


# -- the fourth hardening round, H15: the text of a turn has a limit --------------------------

LIMIT = 1_000_000  # db.validation.MAX_TEXT_LENGTH, as docs/hardening.md states it


@pytest.mark.parametrize(
    "call",
    [
        lambda m, t: m.save_context({"input": t}, {"output": "ok"}),
        lambda m, t: m.save_context({"input": "ok"}, {"output": t}),
        lambda m, t: m.save_contexts([({"input": "ok"}, {"output": "ok"}), ({"input": t}, {})]),
        lambda m, t: m.entity_store["Sarah Chen"].add_context(t),
        lambda m, t: m.load_memory_variables({"input": t}),
    ],
    ids=["input", "output", "save_contexts", "add_context", "recall"],
)
@pytest.mark.parametrize("text", ["x" * (LIMIT + 1), "é" * (LIMIT + 1)], ids=["ascii", "other"])
def test_a_turn_text_over_the_limit_is_refused_and_nothing_is_written(memory, call, text):
    before = (len(memory.chat_memory), memory.get_memory_stats()["total_contexts"])

    message = refused(lambda: call(memory, text))

    assert "1,000,001 characters long; the limit is 1,000,000" in message
    assert (len(memory.chat_memory), memory.get_memory_stats()["total_contexts"]) == before


def test_a_turn_text_of_the_limit_is_stored(memory):
    memory.save_context({"input": "y" * LIMIT}, {"output": "ok"})
    assert len(memory.chat_memory[-1]["input"]) == LIMIT
