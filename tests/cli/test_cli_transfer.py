"""`export` and `import`: a session survives the trip exactly (in one database and from
SQLite to Postgres and back), a non-empty session needs --merge, and a bad file is refused
whole with the number of the bad line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import (
    SESSIONS,
    api_view,
    canonical,
    export_records,
    invoke,
    json_of,
    one_line_error,
    populate,
    session_row_counts,
    succeeded,
    url_maker,
    usage_error,
)
from zerda_store.transfer.format import write_session


def export_file(url: str, session_id: str, path: Path) -> list[str]:
    result = succeeded(invoke(url, "export", "--session", session_id, "-o", str(path)))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert f"exported session {session_id!r}: {len(lines)} lines" in result.stderr
    return lines


def import_file(url: str, path: Path, session_id: str, *extra: str):
    return invoke(url, "import", str(path), "--session", session_id, *extra)


def assert_same_session(source: str, source_id: str, target: str, target_id: str) -> None:
    assert canonical(export_records(target, target_id)) == canonical(
        export_records(source, source_id)
    )
    assert api_view(target, target_id) == api_view(source, source_id)


def test_export_writes_a_header_then_turns_entities_and_snippets(shared_populated, tmp_path):
    lines = [json.loads(line) for line in export_file(shared_populated, "acme", tmp_path / "a")]

    assert lines[0] == {
        "kind": "session",
        "session_id": "acme",
        "format": 3,
        "key_rules": "fold-v2",
    }
    kinds = [line["kind"] for line in lines[1:]]
    assert kinds == ["turn"] * 6 + ["entity"] * 3 + ["context"] * 8 + ["end"]
    assert {key: lines[-1][key] for key in ("turns", "entities", "contexts")} == {
        "turns": 6,
        "entities": 3,
        "contexts": 8,
    }
    assert len(lines[-1]["sha256"]) == 64
    turns = [line for line in lines if line["kind"] == "turn"]
    assert [t["status"] for t in turns] == ["ok", "ok", "ok", "ok", "failed", "ok"]
    assert turns[4]["error"] == "RuntimeError: timeout"
    assert turns[3]["idempotency_key"] == "turn-4"
    assert turns[2]["entity_names"] == ["SARAH CHEN"]
    entities = [line for line in lines if line["kind"] == "entity"]
    assert [(e["name"], e["name_key"]) for e in entities] == [
        ("Acme Corp", "acme corp"),
        ("Sarah Chen", "sarah chen"),
        ("Berlin", "berlin"),
    ]
    snippets = [line for line in lines if line["kind"] == "context"]
    assert [s["turn_id"] is None for s in snippets].count(True) == 1


def test_export_to_standard_output(shared_populated):
    result = succeeded(invoke(shared_populated, "export", "--session", "globex", "-o", "-"))
    lines = result.stdout.splitlines()
    assert json.loads(lines[0])["session_id"] == "globex"
    assert "أحمد" in result.stdout  # readable, not \u-escaped
    assert f"exported session 'globex': {len(lines)} lines" in result.stderr


def test_export_of_a_missing_session_fails_in_one_line(shared_populated, tmp_path):
    out = tmp_path / "nothing.jsonl"
    line = one_line_error(invoke(shared_populated, "export", "--session", "ghost", "-o", str(out)))
    assert "ghost" in line
    assert not out.exists() or out.read_text() == ""


@pytest.mark.parametrize("session_id", SESSIONS)
def test_round_trip_into_a_new_session_of_the_same_database(shared_populated, tmp_path, session_id):
    path = tmp_path / "export.jsonl"
    export_file(shared_populated, session_id, path)
    target = f"{session_id}-round-trip"

    result = succeeded(import_file(shared_populated, path, target))

    expected = {
        "acme": "6 turns, 3 entities, 8 snippets",
        "globex": "3 turns, 4 entities, 6 snippets",
        "quiet": "1 turn, 0 entities, 0 snippets",
    }[session_id]
    assert result.stdout.strip() == (f"imported into {target!r}: {expected}")
    assert_same_session(shared_populated, session_id, shared_populated, target)
    # the source is untouched, and the copy's export names the new session
    assert export_file(shared_populated, target, tmp_path / "again.jsonl")[0] == json.dumps(
        {"kind": "session", "session_id": target, "format": 3, "key_rules": "fold-v2"}
    )


def test_import_reads_standard_input(shared_populated):
    exported = succeeded(invoke(shared_populated, "export", "--session", "globex", "-o", "-"))
    succeeded(
        invoke(shared_populated, "import", "-", "--session", "globex-stdin", input=exported.stdout)
    )
    assert_same_session(shared_populated, "globex", shared_populated, "globex-stdin")


@pytest.mark.postgres
@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
def test_round_trip_between_sqlite_and_postgres(sqlite_url, postgres_url, tmp_path, direction):
    source, target = (
        (sqlite_url, postgres_url)
        if direction == "sqlite-to-postgres"
        else (postgres_url, sqlite_url)
    )
    populate(url_maker(source))

    for session_id in SESSIONS:
        path = tmp_path / f"{session_id}.jsonl"
        export_file(source, session_id, path)
        succeeded(import_file(target, path, session_id))
        assert_same_session(source, session_id, target, session_id)
    assert json_of(invoke(target, "sessions", "--json")) == json_of(
        invoke(source, "sessions", "--json")
    )


def test_import_into_an_empty_database_creates_the_schema(
    shared_populated, empty_database_url, tmp_path
):
    path = tmp_path / "globex.jsonl"
    export_file(shared_populated, "globex", path)

    succeeded(import_file(empty_database_url, path, "globex"))

    assert_same_session(shared_populated, "globex", empty_database_url, "globex")
    assert "(head)" in succeeded(invoke(empty_database_url, "db", "current")).stdout


# -- merging ----------------------------------------------------------------------------------


def test_import_into_a_non_empty_session_is_refused_unless_merge(own_sessions, tmp_path):
    populated, suffix = own_sessions
    acme, globex = "acme" + suffix, "globex" + suffix
    path = tmp_path / "acme.jsonl"
    export_file(populated, acme, path)
    before = export_records(populated, globex)

    line = one_line_error(import_file(populated, path, globex))
    assert "--merge" in line
    assert globex in line
    assert export_records(populated, globex) == before

    result = succeeded(import_file(populated, path, globex, "--merge"))
    assert "6 turns, 3 entities, 8 snippets" in result.stdout
    stats = json_of(invoke(populated, "stats", "--session", globex, "--json"))
    assert (stats["message_count"], stats["entity_count"], stats["total_contexts"]) == (9, 6, 14)
    entities = json_of(invoke(populated, "entities", "--session", globex, "--json"))
    assert [(e["name"], e["type"], e["contexts_count"]) for e in entities] == [
        ("Omar Haddad", "PERSON", 2),
        ("Globex", "ORG", 2),
        ("أحمد", "PERSON", 1),
        ("Sarah Chen", "PERSON", 4),
        ("Acme Corp", "unknown", 4),
        ("Berlin", "unknown", 1),
    ]
    sarah = json_of(
        invoke(populated, "entity", "Sarah Chen", "--session", globex, "--limit", "9", "--json")
    )
    assert sarah["recent_contexts"][0].startswith("Sarah Chen met Omar Haddad")
    assert sarah["recent_contexts"][1].startswith("Hi, this is Acme Corp.")
    # the source session is untouched
    assert json_of(invoke(populated, "stats", "--session", acme, "--json"))["message_count"] == 6


def test_merging_a_session_into_itself_is_not_a_traceback(shared_populated, tmp_path):
    """The file holds a turn with an idempotency key that the session already used."""
    path = tmp_path / "acme.jsonl"
    export_file(shared_populated, "acme", path)
    target = "acme-merged-twice"
    succeeded(import_file(shared_populated, path, target))
    before = export_records(shared_populated, target)

    result = import_file(shared_populated, path, target, "--merge")

    if result.exit_code == 0:
        turns = [r for r in export_records(shared_populated, target) if r["kind"] == "turn"]
        assert [t["idempotency_key"] for t in turns].count("turn-4") == 1
    else:
        one_line_error(result)
        assert export_records(shared_populated, target) == before


# -- bad files ----------------------------------------------------------------------------------


def _drop_field(record: dict, field: str) -> dict:
    return {k: v for k, v in record.items() if k != field}


def corrupt(lines: list[str], how: str) -> tuple[list[str], int | None]:
    """A damaged copy of an export and the number of the line that is wrong (the end
    line stays as it was: a bad record is reported before the checksum)."""
    damaged, number = _corrupt_records(list(lines[:-1]), how)
    return [*damaged, lines[-1]], number


def _corrupt_records(lines: list[str], how: str) -> tuple[list[str], int | None]:
    records = [json.loads(line) for line in lines]
    if how == "bad-json-on-line-3":
        lines[2] = lines[2][:-5]
        return lines, 3
    if how == "missing-field":
        number = next(i for i, r in enumerate(records) if r["kind"] == "entity") + 1
        lines[number - 1] = json.dumps(_drop_field(records[number - 1], "name"))
        return lines, number
    if how == "wrong-type":
        number = 2
        lines[1] = json.dumps({**records[1], "created_at": "yesterday"})
        return lines, number
    if how == "snippet-of-an-unknown-entity":
        number = len(records)
        lines[-1] = json.dumps({**records[-1], "entity_id": 987654})
        return lines, number
    if how == "snippet-of-an-unknown-turn":
        number = len(records)
        lines[-1] = json.dumps({**records[-1], "turn_id": 987654})
        return lines, number
    if how == "name-too-long":
        number = next(i for i, r in enumerate(records) if r["kind"] == "entity") + 1
        lines[number - 1] = json.dumps({**records[number - 1], "name": "N" * 300})
        return lines, number
    if how == "no-header":
        return lines[1:], 1
    if how == "unknown-kind":
        lines.insert(4, json.dumps({"kind": "gossip", "id": 1}))
        return lines, 5
    if how == "duplicate-idempotency-key":
        first = next(r for r in records if r["kind"] == "turn")
        lines.insert(1, json.dumps({**first, "id": 987654, "idempotency_key": "twice"}))
        lines.insert(1, json.dumps({**first, "id": 987655, "idempotency_key": "twice"}))
        return lines, None
    raise AssertionError(how)


@pytest.mark.fans_out
@pytest.mark.parametrize(
    "how",
    [
        "bad-json-on-line-3",
        "missing-field",
        "wrong-type",
        "snippet-of-an-unknown-entity",
        "snippet-of-an-unknown-turn",
        "no-header",
        "unknown-kind",
        "duplicate-idempotency-key",
        "name-too-long",
    ],
)
def test_a_bad_file_is_refused_whole_naming_the_line(shared_populated, tmp_path, how):
    good = export_file(shared_populated, "acme", tmp_path / "good.jsonl")
    lines, number = corrupt(good, how)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sessions_before = json_of(invoke(shared_populated, "sessions", "--json"))
    target = f"bad-{how}"

    line = one_line_error(import_file(shared_populated, path, target))

    if number is not None:
        assert f"line {number}" in line
    assert set(session_row_counts(shared_populated, target).values()) == {0}
    assert json_of(invoke(shared_populated, "sessions", "--json")) == sessions_before


def test_a_bad_file_adds_nothing_to_a_session_with_merge(shared_populated, tmp_path):
    good = export_file(shared_populated, "globex", tmp_path / "good.jsonl")
    lines, _ = corrupt(good, "snippet-of-an-unknown-entity")
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = export_records(shared_populated, "globex")

    one_line_error(import_file(shared_populated, path, "globex", "--merge"))
    assert export_records(shared_populated, "globex") == before


def test_an_empty_file_is_refused(shared_populated, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("", encoding="utf-8")
    line = one_line_error(import_file(shared_populated, path, "from-empty"))
    assert "empty" in line
    assert set(session_row_counts(shared_populated, "from-empty").values()) == {0}


@pytest.mark.fans_out
def test_a_session_id_the_api_refuses_is_refused_by_import(shared_populated, tmp_path):
    """The API takes session ids of 1 to 255 characters; import must not make others."""
    path = tmp_path / "acme.jsonl"
    export_file(shared_populated, "acme", path)
    too_long = "s" * 256
    sessions_before = json_of(invoke(shared_populated, "sessions", "--json"))

    line = usage_error(import_file(shared_populated, path, too_long))

    assert "'--session': a session id must be 1 to 255 characters long" in line
    assert json_of(invoke(shared_populated, "sessions", "--json")) == sessions_before


def test_a_file_with_whole_numbers_for_times_imports(shared_populated, tmp_path):
    """JSON does not tell 1700000000 from 1700000000.0; many turns (arrays on Postgres)
    mixing both must import as they read."""
    records = [json.loads(line) for line in export_file(shared_populated, "acme", tmp_path / "a")]
    turns = [r for r in records if r["kind"] == "turn"]
    template = turns[0]
    extra = [
        {**template, "id": 10_000 + n, "idempotency_key": None, "created_at": 1_700_000_000 + n}
        for n in range(12)
    ]
    path = tmp_path / "mixed.jsonl"
    with path.open("w", encoding="utf-8") as out:
        write_session(out, "acme", [*turns, *extra, *records[len(turns) + 1 : -1]])

    succeeded(import_file(shared_populated, path, "acme-mixed"))

    imported = [r for r in export_records(shared_populated, "acme-mixed") if r["kind"] == "turn"]
    assert len(imported) == len(turns) + 12
    assert [r["created_at"] for r in imported[-12:]] == [1_700_000_000 + n for n in range(12)]


def test_import_prints_a_json_receipt(shared_populated, tmp_path):
    path = tmp_path / "acme.jsonl"
    export_file(shared_populated, "acme", path)

    receipt = json_of(import_file(shared_populated, path, "acme-json", "--json"))

    assert receipt == {
        "session_id": "acme-json",
        "turns": 6,
        "entities": 3,
        "contexts": 8,
        "retention": "none",
        "retention_rules": 0,
    }
