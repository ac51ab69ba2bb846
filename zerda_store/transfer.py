"""The JSON Lines format of ``zerda-store export`` and ``import``: writing and checking it.

One file holds one session: a header line, one line per turn, entity and snippet (in that
order), and an end line with the counts and a SHA-256 of every line before it. A file
without its end line was cut short (a failed export, a full disk) and is refused, so a
partial backup can never be restored as if it were whole.

Ids are the source database's and only tie the records together; an import gives the rows
new ids and keeps their order. Reading checks every line against the rules the API
enforces (types, ranges, storable text, keys recomputed from names) before anything is
written, and refuses a bad file whole with one line naming the line and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .names import is_acceptable_name, name_key
from .schema import contexts, entities, extractions, max_length, turns
from .validation import checked_session_id

FORMAT_VERSION = 2
# The latest moment a timestamp may name (the end of year 9999), in epoch seconds.
MAX_TIMESTAMP = 253_402_300_799.0
_BIGINT = 2**63 - 1
_INTEGER = 2**31 - 1

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
_KINDS = tuple(_FIELDS)

# The smallest and largest value of each whole-number field (the columns' types).
_INT_RANGES = {
    "id": (1, _BIGINT),
    "entity_id": (1, _BIGINT),
    "turn_id": (1, _BIGINT),
    "turn_seq": (0, _BIGINT),
    "first_turn_id": (0, _BIGINT),
    "first_position": (0, _INTEGER),
    "entity_count": (0, _INTEGER),
    "attempts": (0, _INTEGER),
}
_TIMES = {"created_at", "updated_at", "first_seen", "last_seen"}
# Longest text the tables take in these fields (the others are unbounded), from the schema.
_MAX_LENGTHS = {
    "name": max_length(entities.c.name),
    "entity_type": max_length(entities.c.entity_type),
    "idempotency_key": max_length(turns.c.idempotency_key),
    "extractor": max_length(extractions.c.extractor),
}
_STATUSES = {None, "ok", "failed", "skipped"}
assert contexts.c.text.type.python_type is str


class ImportFormatError(ValueError):
    """A file that is not a valid export; the message names the line."""


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"


def write_session(out: IO[str], session_id: str, records: Iterable[dict[str, Any]]) -> int:
    """Write one session's records and the end line; returns the number of lines."""
    digest = hashlib.sha256()
    counts = dict.fromkeys(_KINDS, 0)
    lines = 0
    for record in _with_header(session_id, records):
        text = _line(record)
        out.write(text)
        digest.update(text.encode("utf-8"))
        counts[record["kind"]] = counts.get(record["kind"], 0) + 1
        lines += 1
    out.write(_line({"kind": "end", **_plural(counts), "sha256": digest.hexdigest()}))
    return lines + 1


def _with_header(session_id: str, records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield {"kind": "session", "session_id": session_id, "format": FORMAT_VERSION}
    yield from records


def _plural(counts: dict[str, int]) -> dict[str, int]:
    return {"turns": counts["turn"], "entities": counts["entity"], "contexts": counts["context"]}


def write_session_file(path: str | Path, session_id: str, records: Iterable[dict[str, Any]]) -> int:
    """Write one session to ``path`` atomically: into a temporary file beside it, synced,
    then renamed over it. If anything fails, ``path`` is untouched (an older backup
    there survives) and the temporary file is removed."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".partial", dir=target.parent or "."
    )
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            lines = write_session(out, session_id, records)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _sync_folder(target.parent)
    return lines


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX: fsync the folder)."""
    try:
        descriptor = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


@dataclass
class CheckedFile:
    """What the first pass over a file learnt: its session, its counts, the key mode of
    its entities, and whether it ended with a matching end line."""

    session_id: str = ""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_KINDS, 0))
    normalized: bool | None = None
    _turn_ids: set[int] = field(default_factory=set)
    _entity_ids: set[int] = field(default_factory=set)
    _unique: set[tuple[str, str, Any]] = field(default_factory=set)
    _snippets: set[tuple[int, int]] = field(default_factory=set)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _parse(line: str, number: int) -> Any:
    try:
        return json.loads(line, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ImportFormatError(f"line {number}: not valid JSON ({exc.msg})") from None
    except ValueError as exc:
        raise ImportFormatError(f"line {number}: {exc} (JSON has no NaN or Infinity)") from None
    except RecursionError:
        raise ImportFormatError(
            f"line {number}: nested too deeply to be an export record"
        ) from None


def check_session(lines: Iterable[str], *, allow_unverified: bool = False) -> CheckedFile:
    """Check every line of an export (the first pass); nothing is kept but ids and keys.
    ``allow_unverified`` accepts a file of format 1, which has no end line."""
    checked = CheckedFile()
    digest = hashlib.sha256()
    end: dict[str, Any] | None = None
    version = None
    number = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if end is not None:
            raise ImportFormatError(f"line {number}: a line after the end line")
        record = _parse(line, number)
        if version is None:
            version = _check_header(record, number, allow_unverified)
            checked.session_id = record["session_id"]
        elif isinstance(record, dict) and record.get("kind") == "end" and version >= 2:
            end = record
            continue
        else:
            _check_record(record, number, checked)
        digest.update(line.encode("utf-8", "surrogatepass"))
    if version is None:
        raise ImportFormatError("the file is empty: no session header")
    if version >= 2:
        _check_end(end, number, checked, digest.hexdigest())
    return checked


def _check_header(record: Any, number: int, allow_unverified: bool) -> int:
    if not isinstance(record, dict) or record.get("kind") != "session":
        raise ImportFormatError(f"line {number}: expected the session header first")
    version = record.get("format")
    if version == 1 and not allow_unverified:
        raise ImportFormatError(
            f"line {number}: a format 1 export has no end line, so a file cut short cannot be "
            "told from a whole one; export the session again, or import it with --unverified"
        )
    if version not in (1, FORMAT_VERSION) or isinstance(version, bool):
        raise ImportFormatError(f"line {number}: unknown format {version!r}")
    try:
        checked_session_id(record.get("session_id"))
    except (TypeError, ValueError) as exc:
        raise ImportFormatError(f"line {number}: field 'session_id': {exc}") from None
    return int(version)


def _check_end(end: dict[str, Any] | None, number: int, checked: CheckedFile, sha256: str) -> None:
    if end is None:
        raise ImportFormatError(
            f"line {number}: the file ends without its end line: the export was cut short"
        )
    if {key: end.get(key) for key in ("turns", "entities", "contexts")} != _plural(checked.counts):
        raise ImportFormatError(
            f"the end line's counts {_plural(checked.counts)} do not match the file's records"
        )
    if end.get("sha256") != sha256:
        raise ImportFormatError("the file's checksum does not match its end line: it was changed")


def _problem(number: int, field_name: str, what: str) -> ImportFormatError:
    return ImportFormatError(f"line {number}: field {field_name!r} {what}")


def _check_value(kind: str, field_name: str, value: Any, number: int) -> None:
    types = _FIELDS[kind][field_name]
    if not isinstance(value, types) or isinstance(value, bool):
        raise _problem(number, field_name, "is missing or of the wrong type")
    if isinstance(value, str):
        _check_text(value, field_name, number)
    elif isinstance(value, int) and field_name in _INT_RANGES:
        low, high = _INT_RANGES[field_name]
        if not low <= value <= high:
            raise _problem(number, field_name, f"is out of range ({low} to {high})")
    elif isinstance(value, (int, float)):
        top = MAX_TIMESTAMP if field_name in _TIMES else 1e12
        if not (math.isfinite(value) and 0 <= value <= top):
            raise _problem(number, field_name, f"is out of range (0 to {top:g})")


def _check_text(value: str, field_name: str, number: int) -> None:
    if "\x00" in value:
        raise _problem(number, field_name, "holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _problem(number, field_name, "is not valid Unicode (a lone surrogate)") from None
    limit = _MAX_LENGTHS.get(field_name)
    if limit is not None and len(value) > limit:
        raise _problem(number, field_name, f"is over {limit} characters")


def _check_record(record: Any, number: int, checked: CheckedFile) -> None:
    if not isinstance(record, dict) or record.get("kind") not in _FIELDS:
        raise ImportFormatError(f"line {number}: expected a turn, entity or context record")
    kind = record["kind"]
    for field_name in _FIELDS[kind]:
        _check_value(kind, field_name, record.get(field_name), number)
    {"turn": _check_turn, "entity": _check_entity, "context": _check_context}[kind](
        record, number, checked
    )
    checked.counts[kind] += 1


def _claim(checked: CheckedFile, kind: str, field_name: str, value: Any, number: int) -> None:
    if (kind, field_name, value) in checked._unique:
        raise ImportFormatError(f"line {number}: a second {kind} with this {field_name}")
    checked._unique.add((kind, field_name, value))


def _check_turn(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    if not all(isinstance(n, str) and is_acceptable_name(n) for n in record["entity_names"]):
        raise _problem(number, "entity_names", "must be a list of storable names")
    if record["status"] not in _STATUSES:
        raise _problem(number, "status", "is not an extraction status")
    if checked.counts["entity"] or checked.counts["context"]:
        raise ImportFormatError(f"line {number}: turns must come before entities and snippets")
    _claim(checked, "turn", "id", record["id"], number)
    if record["idempotency_key"] is not None:
        _claim(checked, "turn", "idempotency_key", record["idempotency_key"], number)
    checked._turn_ids.add(record["id"])


def _check_entity(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    name = record["name"]
    if not is_acceptable_name(name):
        raise _problem(number, "name", "is not a storable name")
    if record["entity_type"] != "unknown" and not is_acceptable_name(record["entity_type"]):
        raise _problem(number, "entity_type", "is not a storable type")
    if record["first_seen"] > record["last_seen"]:
        raise _problem(number, "last_seen", "is before first_seen")
    if checked.counts["context"]:
        raise ImportFormatError(f"line {number}: entities must come before snippets")
    _check_key(record, number, checked)
    _claim(checked, "entity", "id", record["id"], number)
    _claim(checked, "entity", "name_key", record["name_key"], number)
    checked._entity_ids.add(record["id"])


def _check_key(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    """The key must be the one the API computes from the name, in one key mode for the
    whole file (normalized, or the original's exact names)."""
    name, key = record["name"], record["name_key"]
    normalized = name_key(name)
    modes = {mode for mode, expected in ((True, normalized), (False, name)) if key == expected}
    if not modes:
        raise _problem(number, "name_key", f"does not match the name (expected {normalized!r})")
    if checked.normalized is not None and checked.normalized not in modes:
        raise _problem(number, "name_key", "is keyed differently from the file's other entities")
    if len(modes) == 1:
        checked.normalized = modes.pop()


def _check_context(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    if record["entity_id"] not in checked._entity_ids:
        raise ImportFormatError(f"line {number}: snippet of an entity not in the file")
    turn_id = record["turn_id"]
    if turn_id is not None:
        if turn_id not in checked._turn_ids:
            raise ImportFormatError(f"line {number}: snippet of a turn not in the file")
        pair = (record["entity_id"], turn_id)
        if pair in checked._snippets:
            raise ImportFormatError(f"line {number}: a second snippet of this entity and turn")
        checked._snippets.add(pair)
    _claim(checked, "context", "id", record["id"], number)


def iter_records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The records of a file that :func:`check_session` accepted (the second pass)."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _parse(line, number)
        if record.get("kind") in _FIELDS:
            yield record


class ExportFile:
    """The records of an export file, read again from its start each time it is iterated
    (an import's unit of work may run again after a deadlock or a lost connection)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def check(self, *, allow_unverified: bool = False) -> CheckedFile:
        with self.path.open(encoding="utf-8", errors="surrogateescape") as lines:
            return check_session(lines, allow_unverified=allow_unverified)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with self.path.open(encoding="utf-8") as lines:
            yield from iter_records(lines)


def read_session(
    lines: Iterable[str], *, allow_unverified: bool = False
) -> tuple[str, list[dict[str, Any]]]:
    """The session id and the checked records of a whole export held in memory."""
    held = list(lines)
    checked = check_session(held, allow_unverified=allow_unverified)
    return checked.session_id, list(iter_records(held))
