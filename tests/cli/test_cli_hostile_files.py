"""The fourth hardening round's files (docs/hardening.md): an import reads its file once
(a stream such as ``<(gunzip -c f)`` restores everything, a file replaced after its check
is not what gets written), an export never writes over the database it reads, an export
whose turns were put out of order is refused, and a file merged twice is refused."""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cli.helpers import export_records, invoke, json_of, one_line_error, succeeded
from tests.cli.test_cli_transfer import export_file, import_file
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory
from zerda_store.errors import MergeError
from zerda_store.model.names import KEY_RULES

# -- H1: one read of the file -----------------------------------------------------------------


@contextmanager
def pipe_of(data: bytes) -> Iterator[str]:
    """A path that reads ``data`` once, as bash's ``<(gunzip -c f)`` does (a second open
    reads nothing)."""
    read_end, write_end = os.pipe()

    def write() -> None:
        with os.fdopen(write_end, "wb") as out:
            out.write(data)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield f"/dev/fd/{read_end}"
    finally:
        writer.join()
        os.close(read_end)


def test_import_from_a_stream_restores_every_turn(shared_populated, tmp_path):
    path = tmp_path / "acme.jsonl"
    export_file(shared_populated, "acme", path)

    with pipe_of(path.read_bytes()) as stream:
        result = succeeded(invoke(shared_populated, "import", stream, "--session", "acme-piped"))

    assert "6 turns, 3 entities, 8 snippets" in result.stdout
    stats = json_of(invoke(shared_populated, "stats", "--session", "acme-piped", "--json"))
    assert stats["message_count"] == 6


def test_a_file_replaced_after_its_check_is_not_what_is_imported(
    shared_populated, tmp_path, monkeypatch
):
    from zerda_store.transfer import format as export_format

    path = tmp_path / "quiet.jsonl"
    export_file(shared_populated, "quiet", path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    turn = json.loads(lines[1])
    hostile = json.dumps({**turn, "input_text": "nul \u0000 here", "created_at": -5.0}) + "\n"
    checked = export_format.check_session

    def check_then_replace(*args, **kwargs):
        answer = checked(*args, **kwargs)
        replaced = tmp_path / "replaced.jsonl"
        replaced.write_text(lines[0] + hostile + lines[2], encoding="utf-8")
        os.replace(replaced, path)
        return answer

    monkeypatch.setattr(export_format, "check_session", check_then_replace)
    succeeded(import_file(shared_populated, path, "quiet-replaced"))

    turns = [r for r in export_records(shared_populated, "quiet-replaced") if r["kind"] == "turn"]
    assert [(t["input_text"], t["created_at"]) for t in turns] == [
        (turn["input_text"], turn["created_at"])
    ]


# -- H2: an export never replaces the database it reads ---------------------------------------


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
@pytest.mark.parametrize("spelling", ["as-given", "relative", "symlink"])
def test_export_refuses_the_file_of_the_database_it_reads(
    sqlite_url, tmp_path, monkeypatch, suffix, spelling
):
    with ConversationEntityMemory(database_url=sqlite_url, session_id="s") as memory:
        memory.save_context({"input": "Sarah Chen called."}, {"output": "Noted."})
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    before = database.read_bytes()
    target = Path(f"{database}{suffix}")
    if spelling == "relative":
        monkeypatch.chdir(database.parent)
        target = Path(target.name)
    elif spelling == "symlink":
        link = tmp_path / "elsewhere.jsonl"
        link.symlink_to(target)
        target = link

    line = one_line_error(invoke(sqlite_url, "export", "--session", "s", "-o", str(target)))

    assert "a file of the database this command reads" in line
    assert database.read_bytes() == before
    assert json_of(invoke(sqlite_url, "stats", "--session", "s", "--json"))["message_count"] == 1


# -- H6: turns out of order ---------------------------------------------------------------------


def _resealed(lines: list[str]) -> str:
    """Records edited by hand, with a recomputed end line (a checksum is no signature)."""
    from zerda_store.transfer.format import write_session

    header = json.loads(lines[0])
    records = [json.loads(line) for line in lines[1:-1]]
    out = io.StringIO()
    write_session(out, header["session_id"], records, KEY_RULES[header["key_rules"]])
    return out.getvalue()


@pytest.mark.fans_out  # lists or copies every session
def test_an_export_with_its_turns_out_of_order_is_refused(shared_populated, tmp_path):
    path = tmp_path / "acme.jsonl"
    lines = [line + "\n" for line in export_file(shared_populated, "acme", path)]
    lines[1], lines[4] = lines[4], lines[1]  # the fourth turn first, the first fourth
    path.write_text(_resealed(lines), encoding="utf-8")

    line = one_line_error(import_file(shared_populated, path, "acme-shuffled"))

    assert "line 3: field 'id' is out of order" in line
    listed = json_of(invoke(shared_populated, "sessions", "--json"))
    assert "acme-shuffled" not in [s["session_id"] for s in listed]


# -- the same file merged twice ---------------------------------------------------------------


def test_merging_the_same_file_twice_is_refused(own_sessions, tmp_path):
    populated, suffix = own_sessions
    quiet, globex = "quiet" + suffix, "globex" + suffix
    path = tmp_path / "globex.jsonl"
    export_file(populated, globex, path)
    succeeded(import_file(populated, path, quiet, "--merge"))
    before = export_records(populated, quiet)

    line = one_line_error(import_file(populated, path, quiet, "--merge"))

    assert "already holds the file's first turn" in line
    assert export_records(populated, quiet) == before
    assert json_of(invoke(populated, "stats", "--session", quiet, "--json"))["message_count"] == 4


# -- H5: an entity's name and another's alias ---------------------------------------------------

PEOPLE = ("Robert", "Bob", "Carol")


def _people(url: str, session_id: str) -> ConversationEntityMemory:
    memory = ConversationEntityMemory(KeywordLLM(PEOPLE), database_url=url, session_id=session_id)
    for name in PEOPLE:
        memory.save_context({"input": f"{name} called."}, {"output": "Noted."})
    return memory


def test_unmerge_refuses_to_bring_back_a_name_that_is_another_entitys_alias(database_url, tmp_path):
    with _people(database_url, "s") as memory:
        merged = memory.merge_entities("Robert", "Bob")
        memory.remove_alias("Bob")
        memory.add_alias("Carol", "Bob")

        with pytest.raises(MergeError, match="'Bob' is an alias of 'Carol' now"):
            memory.unmerge(merged["merge_id"])

        assert memory.list_entities() == ["Robert", "Carol"]
    path = tmp_path / "s.jsonl"
    export_file(database_url, "s", path)
    succeeded(import_file(database_url, path, "s-restored"))


def test_a_held_apart_entity_named_as_another_entitys_alias_exports_and_imports(
    database_url, tmp_path
):
    with _people(database_url, "s") as memory:
        memory.forget_entity("Bob")
        memory.add_alias("Carol", "Bob")
    path = tmp_path / "crafted.jsonl"
    with _people(database_url, "source") as source:
        source.forget_entity("Carol")
    lines = [json.loads(line) for line in export_file(database_url, "source", path)]
    for record in lines:
        if record["kind"] == "entity" and record["name"] == "Bob":
            record["name_key"] = record["core_key"] = "\x02apart 999"
    path.write_text(_resealed([json.dumps(r, ensure_ascii=False) + "\n" for r in lines]))
    succeeded(import_file(database_url, path, "s", "--merge"))

    again = tmp_path / "again.jsonl"
    export_file(database_url, "s", again)
    succeeded(import_file(database_url, again, "s-again"))
    assert json_of(invoke(database_url, "alias", "list", "--session", "s-again", "--json")) == [
        {"entity": "Carol", "alias": "Bob", "source": "manual"}
    ]


def test_copy_refuses_the_database_it_reads_as_its_destination(sqlite_url, tmp_path):
    with ConversationEntityMemory(database_url=sqlite_url, session_id="s") as memory:
        memory.save_context({"input": "Sarah Chen called."}, {"output": "Noted."})
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    link = tmp_path / "same.db"
    link.symlink_to(database)

    for destination in (sqlite_url, f"sqlite:///{link}"):
        line = one_line_error(invoke(sqlite_url, "copy", "--to", destination))
        assert "a file of the database this command reads" in line
