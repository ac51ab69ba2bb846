"""`export` and `import` when things go wrong: a failed export leaves any older file as it
was and no partial one; a truncated or hostile file is refused in one line, nothing written."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import zerda_store.transfer.format as transfer_module
from tests.cli.helpers import invoke, json_of, one_line_error, session_row_counts, succeeded
from zerda_store.admin import AdminRepository


def _export(url: str, session_id: str, path: Path) -> list[str]:
    succeeded(invoke(url, "export", "--session", session_id, "-o", str(path)))
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def _import(url: str, path: Path, session_id: str):
    return invoke(url, "import", str(path), "--session", session_id)


def _fail_after(count: int, error: BaseException):
    """An ``export_session`` that gives ``count`` records, then fails as a dropped
    connection or a broken disk would."""
    real = AdminRepository.export_session

    def export_session(self, session_id):
        for number, record in enumerate(real(self, session_id)):
            if number == count:
                raise error
            yield record

    return export_session


@pytest.mark.parametrize(
    "error",
    [
        ConnectionError("server closed the connection unexpectedly"),
        OSError(errno.ENOSPC, "No space left on device"),
    ],
    ids=["lost-connection", "full-disk"],
)
def test_a_failed_export_keeps_the_old_file_and_leaves_no_partial_one(
    shared_populated, tmp_path, monkeypatch, error
):
    backup = tmp_path / "acme.jsonl"
    old = _export(shared_populated, "acme", backup)
    monkeypatch.setattr(AdminRepository, "export_session", _fail_after(5, error))

    result = invoke(shared_populated, "export", "--session", "acme", "-o", str(backup))

    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert backup.read_text(encoding="utf-8").splitlines(keepends=True) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acme.jsonl"]


def test_a_full_disk_is_one_line_naming_the_file(shared_populated, tmp_path, monkeypatch):
    def no_space(_descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transfer_module.os, "fsync", no_space)
    target = tmp_path / "acme.jsonl"

    line = one_line_error(
        invoke(shared_populated, "export", "--session", "acme", "-o", str(target))
    )

    assert "No space left on device" in line and str(target) in line
    assert list(tmp_path.iterdir()) == []


def test_an_export_cut_short_at_any_line_is_refused_and_writes_nothing(shared_populated, tmp_path):
    lines = _export(shared_populated, "acme", tmp_path / "whole.jsonl")
    for keep in (2, len(lines) // 3, len(lines) - 1):
        cut = tmp_path / f"cut-{keep}.jsonl"
        cut.write_text("".join(lines[:keep]), encoding="utf-8")

        line = one_line_error(_import(shared_populated, cut, f"restored-{keep}"))

        assert "cut short" in line
        assert set(session_row_counts(shared_populated, f"restored-{keep}").values()) == {0}


@pytest.mark.fans_out
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("created_at", "Infinity", "NaN or Infinity"),
        ("created_at", "NaN", "NaN or Infinity"),
        ("created_at", "1e300", "field 'created_at' is out of range"),
        ("created_at", "-1", "field 'created_at' is out of range"),
        ("id", str(2**64), "field 'id' is out of range"),
        ("created_at", str(10**400), "field 'created_at' is out of range"),
        ("created_at", str(-(10**400)), "field 'created_at' is out of range"),
        ("latency_ms", str(10**400), "field 'latency_ms' is out of range"),
        ("created_at", "9" * 5000, "a number of more than 4300 digits"),
    ],
    ids=[
        "infinity",
        "nan",
        "1e300",
        "negative",
        "id-2**64",
        "10**400",
        "-10**400",
        "latency-10**400",
        "5000-digits",
    ],
)
def test_numbers_that_would_corrupt_the_store_are_refused(
    shared_populated, tmp_path, field, value, message
):
    lines = _export(shared_populated, "acme", tmp_path / "good.jsonl")
    record = json.loads(lines[1])
    text = json.dumps(record).replace(
        f'"{field}": {json.dumps(record[field])}', f'"{field}": {value}'
    )
    lines[1] = text + "\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines), encoding="utf-8")

    line = one_line_error(_import(shared_populated, bad, "hostile"))

    assert "line 2" in line and message in line
    assert set(session_row_counts(shared_populated, "hostile").values()) == {0}
    json_of(invoke(shared_populated, "sessions", "--json"))  # still valid JSON for everyone


def test_an_entity_whose_key_is_not_its_names_is_refused(shared_populated, tmp_path):
    lines = _export(shared_populated, "acme", tmp_path / "good.jsonl")
    number = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "entity")
    lines[number] = json.dumps({**json.loads(lines[number]), "name_key": "nobody"}) + "\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines), encoding="utf-8")

    line = one_line_error(_import(shared_populated, bad, "rekeyed"))

    assert f"line {number + 1}" in line and "name_key" in line
    assert set(session_row_counts(shared_populated, "rekeyed").values()) == {0}


def test_a_line_nested_200000_deep_is_one_line_not_a_traceback(shared_populated, tmp_path):
    lines = _export(shared_populated, "acme", tmp_path / "good.jsonl")
    lines.insert(2, "[" * 200_000 + "]" * 200_000 + "\n")
    bad = tmp_path / "deep.jsonl"
    bad.write_text("".join(lines), encoding="utf-8")

    assert "line 3: nested too deeply" in one_line_error(_import(shared_populated, bad, "deep"))


def test_a_byte_that_is_not_utf8_is_named_as_such_with_its_line(shared_populated, tmp_path):
    lines = _export(shared_populated, "acme", tmp_path / "good.jsonl")
    bad = tmp_path / "latin1.jsonl"
    raw = "".join(lines).encode("utf-8").split(b"\n")
    raw[1] = raw[1].replace(b"Acme", b"Acm\xe9", 1)
    bad.write_bytes(b"\n".join(raw))

    line = one_line_error(_import(shared_populated, bad, "latin1"))

    assert "line 2" in line and "not valid UTF-8" in line and "0xe9" in line
    assert "surrogate" not in line
    assert set(session_row_counts(shared_populated, "latin1").values()) == {0}
