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
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from ..model.names import FOLD_V1, KEY_RULES, KeyRules
from ..retention.carrying import checked_carried
from ..validation import checked_session_id
from .checks import (
    CURRENT_RULES,
    KINDS,
    LEGACY_RULES,
    CheckedFile,
    ImportFormatError,
    check_record,
    plural_counts,
)

__all__ = ["ExportFile", "ImportFormatError", "check_session", "read_session", "write_session"]

FORMAT_VERSION = 3


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"


def write_session(
    out: IO[str],
    session_id: str,
    records: Iterable[dict[str, Any]],
    key_rules: KeyRules | None = None,
    retention: dict[str, Any] | None = None,
) -> int:
    """Write one session's records and the end line; returns the number of lines. The
    header names the session's ``key_rules`` (those its keys were made with) and carries
    its ``retention`` policy (:mod:`retention.carrying`), if any."""
    digest = hashlib.sha256()
    counts = dict.fromkeys(KINDS, 0)
    lines = 0
    for record in _with_header(session_id, records, key_rules, retention):
        text = _line(record)
        out.write(text)
        digest.update(text.encode("utf-8"))
        counts[record["kind"]] = counts.get(record["kind"], 0) + 1
        lines += 1
    out.write(_line({"kind": "end", **plural_counts(counts), "sha256": digest.hexdigest()}))
    return lines + 1


def _with_header(
    session_id: str,
    records: Iterable[dict[str, Any]],
    key_rules: KeyRules | None,
    retention: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    header: dict[str, Any] = {"kind": "session", "session_id": session_id, "format": FORMAT_VERSION}
    if key_rules is not None:
        header["key_rules"] = key_rules.name
    if retention:
        header["retention"] = retention
    yield header
    yield from records


def write_session_file(
    path: str | Path,
    session_id: str,
    records: Iterable[dict[str, Any]],
    key_rules: KeyRules | None = None,
    retention: dict[str, Any] | None = None,
) -> int:
    """Write one session to ``path`` atomically: into a temporary file beside it, synced,
    then renamed over it. If anything fails, ``path`` is untouched (an older backup
    there survives) and the temporary file is removed."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".partial", dir=target.parent or "."
    )
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            lines = write_session(out, session_id, records, key_rules, retention)
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


class _NotANumber(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotANumber(f"{name} is not a number")


def _parse(line: str, number: int) -> Any:
    try:
        return json.loads(line, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ImportFormatError(f"line {number}: not valid JSON ({exc.msg})") from None
    except _NotANumber as exc:
        raise ImportFormatError(f"line {number}: {exc} (JSON has no NaN or Infinity)") from None
    except ValueError:  # Python's limit on the digits of an int read from text
        raise ImportFormatError(
            f"line {number}: a number of more than {sys.get_int_max_str_digits()} digits, "
            "out of range of every field"
        ) from None
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
        _check_bytes(line, number)
        record = _parse(line, number)
        if version is None:
            version = _check_header(record, number, allow_unverified)
            checked.session_id = record["session_id"]
            checked.version = version
            checked.key_rules = _header_rules(record, version)
            checked.retention = _header_retention(record)
        elif isinstance(record, dict) and record.get("kind") == "end" and version >= 2:
            end = record
            continue
        else:
            check_record(record, number, checked)
        digest.update(line.encode("utf-8", "surrogatepass"))
    if version is None:
        raise ImportFormatError("the file is empty: no session header")
    if version >= 2:
        _check_end(end, number, checked, digest.hexdigest())
    return checked


# What reading with errors="surrogateescape" makes of each byte that is not UTF-8.
_UNDECODED = re.compile("[\udc80-\udcff]")


def _check_bytes(line: str, number: int) -> None:
    """A line read from a file holds only UTF-8 (a JSON escape of a lone surrogate is
    text here, refused later as such)."""
    found = _UNDECODED.search(line)
    if found is not None:
        byte = ord(found.group()) - 0xDC00
        raise ImportFormatError(
            f"line {number}: not valid UTF-8 (byte 0x{byte:02x} at character "
            f"{found.start() + 1}); export files are UTF-8"
        )


def _check_header(record: Any, number: int, allow_unverified: bool) -> int:
    if not isinstance(record, dict) or record.get("kind") != "session":
        raise ImportFormatError(f"line {number}: expected the session header first")
    version = record.get("format")
    if version == 1 and not allow_unverified:
        raise ImportFormatError(
            f"line {number}: a format 1 export has no end line, so a file cut short cannot be "
            "told from a whole one; export the session again, or import it with --unverified"
        )
    if version not in (1, 2, FORMAT_VERSION) or isinstance(version, bool):
        raise ImportFormatError(f"line {number}: unknown format {version!r}")
    try:
        checked_session_id(record.get("session_id"))
    except (TypeError, ValueError) as exc:
        raise ImportFormatError(f"line {number}: field 'session_id': {exc}") from None
    return int(version)


def _header_rules(header: dict[str, Any], version: int) -> tuple[KeyRules, ...]:
    """The key rules a file's keys may have: those its header names, else (an older file
    or a header without them) those of its format."""
    name = header.get("key_rules")
    if name is None:
        return LEGACY_RULES if version < 3 else CURRENT_RULES
    rules = KEY_RULES.get(name) if isinstance(name, str) else None
    if rules is None or rules is FOLD_V1:
        raise ImportFormatError(f"line 1: field 'key_rules' names no key rules: {name!r}")
    return (rules,)


def _header_retention(header: dict[str, Any]) -> dict[str, Any]:
    """The retention policy a header carries ({} for none), checked as ``set_retention``
    checks it."""
    if "retention" not in header:
        return {}
    try:
        return checked_carried(header["retention"])
    except (TypeError, ValueError) as exc:
        raise ImportFormatError(f"line 1: field 'retention': {exc}") from None


def _check_end(end: dict[str, Any] | None, number: int, checked: CheckedFile, sha256: str) -> None:
    if end is None:
        raise ImportFormatError(
            f"line {number}: the file ends without its end line: the export was cut short"
        )
    expected = plural_counts(checked.counts)
    if (
        {key: end.get(key) for key in expected} != expected
        or end.get("aliases", 0) != checked.counts["alias"]
        or end.get("judgements", 0) != checked.counts["judgement"]
    ):
        raise ImportFormatError(
            f"the end line's counts {plural_counts(checked.counts)} do not match the file's records"
        )
    if end.get("sha256") != sha256:
        raise ImportFormatError("the file's checksum does not match its end line: it was changed")


def iter_records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The records of a file that :func:`check_session` accepted (the second pass)."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _parse(line, number)
        if record.get("kind") in KINDS:
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
