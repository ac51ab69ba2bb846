from __future__ import annotations

import io
import json

import pytest

from zerda_store.transfer import ImportFormatError, read_session, write_session

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
        ("{not json", "line 3: not valid JSON"),
        (json.dumps({**ENTITY, "name": 5}), "line 3: field 'name'"),
        (json.dumps({"kind": "nonsense"}), "line 3: expected a turn"),
        (json.dumps({**CONTEXT, "entity_id": 99}), "line 3: snippet of an entity not in the file"),
        (json.dumps({**CONTEXT, "turn_id": 99}), "line 3: snippet of a turn not in the file"),
        (json.dumps({**TURN, "input_text": "a\x00b"}), "line 3: field 'input_text' holds a NUL"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(line, message):
    lines = _file(TURN, ENTITY)
    lines.insert(2, line + "\n")
    with pytest.raises(ImportFormatError, match=message.replace("(", r"\(")):
        read_session(lines)


def test_a_file_without_the_header_is_refused():
    with pytest.raises(ImportFormatError, match="line 1: expected the session header"):
        read_session([json.dumps(TURN) + "\n"])
    with pytest.raises(ImportFormatError, match="empty"):
        read_session([])
