from __future__ import annotations

import io
import json

import pytest

from zerda_store.transfer.format import ImportFormatError, read_session, write_session

TURN = {
    "kind": "turn",
    "id": 7,
    "input_text": "hi Sarah",
    "output_text": "hello",
    "entity_names": ["Sarah"],
    "created_at": 1.5,
    "idempotency_key": None,
    "extractor": "llm",
    "status": "ok",
    "error": None,
    "latency_ms": 0.1,
    "entity_count": 1,
    "attempts": 1,
    "updated_at": 1.5,
}
ENTITY = {
    "kind": "entity",
    "id": 3,
    "name_key": "sarah",
    "core_key": "sarah",
    "name": "Sarah",
    "entity_type": "unknown",
    "first_seen": 1.5,
    "last_seen": 1.5,
    "first_turn_id": 7,
    "first_position": 0,
}
CONTEXT = {"kind": "context", "id": 9, "entity_id": 3, "turn_id": 7, "turn_seq": 7, "text": "hi"}


def _file(*records: dict) -> list[str]:
    out = io.StringIO()
    write_session(out, "s1", records)
    return out.getvalue().splitlines(keepends=True)


def test_written_records_read_back_identically():
    assert read_session(_file(TURN, ENTITY, CONTEXT)) == ("s1", [TURN, ENTITY, CONTEXT])


def test_arabic_text_is_written_as_text_not_escapes():
    lines = _file({**TURN, "input_text": "مرحبا"})
    assert "مرحبا" in lines[1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 4: not valid JSON"),
        (json.dumps({**ENTITY, "id": 4, "name": 5}), "line 4: field 'name'"),
        (json.dumps({"kind": "nonsense"}), "line 4: expected a turn"),
        (json.dumps({**CONTEXT, "entity_id": 99}), "line 4: snippet of an entity not in the file"),
        (json.dumps({**CONTEXT, "turn_id": 99}), "line 4: snippet of a turn not in the file"),
        (json.dumps({**CONTEXT, "text": "a\x00b"}), "line 4: field 'text' holds a NUL"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(line, message):
    lines = _file(TURN, ENTITY)
    lines.insert(3, line + "\n")
    with pytest.raises(ImportFormatError, match=message.replace("(", r"\(")):
        read_session(lines)


def test_a_file_without_the_header_is_refused():
    with pytest.raises(ImportFormatError, match="line 1: expected the session header"):
        read_session([json.dumps(TURN) + "\n"])
    with pytest.raises(ImportFormatError, match="empty"):
        read_session([])


def _refused(*records: dict, match: str) -> None:
    with pytest.raises(ImportFormatError, match=match):
        read_session(_file(*records))


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({**TURN, "created_at": 1e300}, "line 2: field 'created_at' is out of range"),
        ({**TURN, "created_at": -5.0}, "line 2: field 'created_at' is out of range"),
        ({**TURN, "latency_ms": -1}, "line 2: field 'latency_ms' is out of range"),
        ({**TURN, "id": 2**64}, "line 2: field 'id' is out of range"),
        ({**TURN, "attempts": 2**40}, "line 2: field 'attempts' is out of range"),
        ({**TURN, "input_text": "\ud800"}, "line 2: field 'input_text' is not valid Unicode"),
        ({**TURN, "entity_names": ["a\x1bb"]}, "line 2: field 'entity_names'"),
        ({**TURN, "idempotency_key": "k" * 256}, "line 2: field 'idempotency_key' is over 255"),
    ],
)
def test_values_the_api_would_refuse_are_refused_naming_line_and_field(record, match):
    lines = _file(TURN, ENTITY, CONTEXT)
    lines[1] = json.dumps(record) + "\n"  # as a hand-edited or hostile file would hold it
    with pytest.raises(ImportFormatError, match=match):
        read_session(lines)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused(constant):
    lines = _file(TURN, ENTITY, CONTEXT)
    lines[1] = lines[1].replace('"created_at": 1.5', f'"created_at": {constant}')
    with pytest.raises(ImportFormatError, match=r"line 2: .*JSON has no NaN or Infinity"):
        read_session(lines)


def test_a_key_that_does_not_match_its_name_is_refused():
    _refused(TURN, {**ENTITY, "name_key": "someone else"}, match="line 3: field 'name_key'")


def test_exact_keys_are_accepted_but_not_mixed_with_normalized_ones():
    exact = {**ENTITY, "name": "Sarah", "name_key": "Sarah", "core_key": "Sarah"}
    assert read_session(_file(TURN, exact))[1][1]["name_key"] == "Sarah"
    normalized = {**ENTITY, "id": 4, "name": "Omar", "name_key": "omar", "core_key": "omar"}
    _refused(TURN, exact, normalized, match="line 4: field 'name_key' is keyed differently")


def test_a_second_snippet_of_one_entity_and_turn_is_refused():
    _refused(TURN, ENTITY, CONTEXT, {**CONTEXT, "id": 10}, match="line 5: a second snippet")


def test_last_seen_before_first_seen_is_refused():
    _refused(TURN, {**ENTITY, "first_seen": 9.0}, match="line 3: field 'last_seen'")


def test_a_deeply_nested_line_is_one_error_not_a_recursion_error():
    lines = _file(TURN)
    lines.insert(2, "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(ImportFormatError, match="line 3: nested too deeply"):
        read_session(lines)


def test_a_file_cut_short_is_refused_even_at_a_line_boundary():
    lines = _file(TURN, ENTITY, CONTEXT)
    for cut in range(1, len(lines)):
        with pytest.raises(ImportFormatError, match=r"cut short|empty"):
            read_session(lines[:cut])


def test_a_changed_line_is_found_by_the_checksum():
    lines = _file(TURN, ENTITY, CONTEXT)
    lines[1] = lines[1].replace("hi Sarah", "hi Sally")
    with pytest.raises(ImportFormatError, match="checksum"):
        read_session(lines)


def test_the_end_line_counts_must_match():
    lines = _file(TURN, ENTITY, CONTEXT)
    del lines[3]  # the snippet line; the checksum would fail too, the counts are checked first
    with pytest.raises(ImportFormatError, match="counts"):
        read_session(lines)


def test_a_format_1_file_needs_unverified():
    lines = [json.dumps({"kind": "session", "session_id": "s1", "format": 1}) + "\n"]
    lines += [json.dumps(record) + "\n" for record in (TURN, ENTITY, CONTEXT)]
    with pytest.raises(ImportFormatError, match="--unverified"):
        read_session(lines)
    assert read_session(lines, allow_unverified=True) == ("s1", [TURN, ENTITY, CONTEXT])


def test_lines_after_the_end_line_are_refused():
    lines = _file(TURN)
    lines.append(json.dumps(TURN) + "\n")
    with pytest.raises(ImportFormatError, match="after the end line"):
        read_session(lines)
