"""The JSON Lines format of ``zerda-store export`` and ``import``: writing and checking it.

One file holds one session: a header line, then one line per turn, entity and snippet.
Ids are the source database's and only tie the records together; an import gives the rows
new ids and keeps their order. Reading checks every line before anything is written, so a
bad file is refused whole, with the number of the first bad line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import IO, Any

from .names import MAX_NAME_LENGTH, is_acceptable_name

FORMAT_VERSION = 1

_NUMBER = (int, float)
_OPTIONAL_STR = (str, type(None))
_OPTIONAL_INT = (int, type(None))
_OPTIONAL_NUMBER = (int, float, type(None))

_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "turn": {
        "id": (int,),
        "input_text": (str,),
        "output_text": (str,),
        "entity_names": (list,),
        "created_at": _NUMBER,
        "idempotency_key": _OPTIONAL_STR,
        "extractor": _OPTIONAL_STR,
        "status": _OPTIONAL_STR,
        "error": _OPTIONAL_STR,
        "latency_ms": _OPTIONAL_NUMBER,
        "entity_count": _OPTIONAL_INT,
        "attempts": _OPTIONAL_INT,
        "updated_at": _OPTIONAL_NUMBER,
    },
    "entity": {
        "id": (int,),
        "name_key": (str,),
        "name": (str,),
        "entity_type": (str,),
        "first_seen": _NUMBER,
        "last_seen": _NUMBER,
        "first_turn_id": (int,),
        "first_position": (int,),
    },
    "context": {
        "id": (int,),
        "entity_id": (int,),
        "turn_id": _OPTIONAL_INT,
        "turn_seq": (int,),
        "text": (str,),
    },
}


# Longest text the tables take in these fields (the others are unbounded).
_MAX_LENGTHS = {
    "name": MAX_NAME_LENGTH,
    "entity_type": 64,
    "idempotency_key": 255,
    "extractor": 64,
}
_STATUSES = {None, "ok", "failed", "skipped"}


class ImportFormatError(ValueError):
    """A file that is not a valid export; the message names the line."""


def write_session(out: IO[str], session_id: str, records: Iterable[dict[str, Any]]) -> int:
    """Write one session's records; returns the number of lines written."""
    header = {"kind": "session", "session_id": session_id, "format": FORMAT_VERSION}
    out.write(json.dumps(header, ensure_ascii=False) + "\n")
    lines = 1
    for record in records:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        lines += 1
    return lines


def _check_record(record: Any, number: int) -> dict[str, Any]:
    if not isinstance(record, dict) or record.get("kind") not in _FIELDS:
        raise ImportFormatError(f"line {number}: expected a turn, entity or context record")
    for field, types in _FIELDS[record["kind"]].items():
        value = record.get(field)
        if not isinstance(value, types) or isinstance(value, bool):
            raise ImportFormatError(
                f"line {number}: field {field!r} is missing or of the wrong type"
            )
        if isinstance(value, str) and "\x00" in value:
            raise ImportFormatError(f"line {number}: field {field!r} holds a NUL character")
        limit = _MAX_LENGTHS.get(field)
        if limit is not None and isinstance(value, str) and len(value) > limit:
            raise ImportFormatError(f"line {number}: field {field!r} is over {limit} characters")
    if record["kind"] == "entity" and not is_acceptable_name(record["name"]):
        raise ImportFormatError(f"line {number}: {record['name']!r} is not a storable name")
    if record["kind"] == "turn":
        if not all(isinstance(n, str) for n in record["entity_names"]):
            raise ImportFormatError(f"line {number}: entity_names must be a list of strings")
        if record["status"] not in _STATUSES:
            raise ImportFormatError(f"line {number}: unknown extraction status")
    return record


def _check_unique(records: list[tuple[int, dict[str, Any]]]) -> None:
    seen: set[tuple[str, str, Any]] = set()
    for number, record in records:
        keys = [("id", record["id"])]
        if record["kind"] == "turn" and record["idempotency_key"] is not None:
            keys.append(("idempotency_key", record["idempotency_key"]))
        if record["kind"] == "entity":
            keys.append(("name_key", record["name_key"]))
        for field, value in keys:
            if (record["kind"], field, value) in seen:
                raise ImportFormatError(
                    f"line {number}: a second {record['kind']} with this {field}"
                )
            seen.add((record["kind"], field, value))


def _check_references(records: list[tuple[int, dict[str, Any]]]) -> None:
    _check_unique(records)
    turn_ids = {r["id"] for _, r in records if r["kind"] == "turn"}
    entity_ids = {r["id"] for _, r in records if r["kind"] == "entity"}
    for number, record in records:
        if record["kind"] != "context":
            continue
        if record["entity_id"] not in entity_ids:
            raise ImportFormatError(f"line {number}: snippet of an entity not in the file")
        if record["turn_id"] is not None and record["turn_id"] not in turn_ids:
            raise ImportFormatError(f"line {number}: snippet of a turn not in the file")


def read_session(lines: Iterable[str]) -> tuple[str, list[dict[str, Any]]]:
    """The session id of the header and the checked records of an export file."""
    session_id: str | None = None
    records: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ImportFormatError(f"line {number}: not valid JSON ({exc.msg})") from None
        if session_id is None:
            if not isinstance(record, dict) or record.get("kind") != "session":
                raise ImportFormatError(f"line {number}: expected the session header first")
            if record.get("format") != FORMAT_VERSION:
                raise ImportFormatError(f"line {number}: unknown format {record.get('format')!r}")
            session_id = str(record.get("session_id"))
            continue
        records.append((number, _check_record(record, number)))
    if session_id is None:
        raise ImportFormatError("the file is empty: no session header")
    _check_references(records)
    return session_id, [record for _, record in records]
