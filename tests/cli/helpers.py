"""Shared pieces of the command-line tests: running the command, a populated memory, and
id-free views of a session for comparing two databases."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from click.testing import CliRunner, Result

from tests.doubles import BrokenLLM, KeywordLLM, TypedExtractor
from zerda_store import ConversationEntityMemory
from zerda_store.cli import main
from zerda_store.db.connections.urls import DATABASE_URL_ENV
from zerda_store.model.names import name_key

VOCABULARY = (
    "Sarah Chen",
    "SARAH CHEN",
    "Acme Corp",
    "Berlin",
    "Omar Haddad",
    "Globex",
    "أحمد",
)

# Session "acme": a normalized duplicate name, an idempotency key, a failed extraction, and a
# snippet added on its own between turns.
ACME_TURNS = (
    ("Hi, this is Acme Corp. Sarah Chen leads procurement.", "Welcome, Sarah Chen."),
    ("Sarah Chen wants 200 licences delivered to Berlin.", "The quote for Berlin is coming."),
    ("SARAH CHEN called again about the quote.", "Noted, I will chase it."),
)
ACME_KEYED_TURN = ("Acme Corp renewed for a year.", "Great news.")
ACME_FAILED_TURN = ("The Berlin office moves in May.", "Thanks for the update.")
ACME_NOTE = "Note: Acme Corp prefers email."
ACME_LAST_TURN = ("Acme Corp asked for an invoice.", "Sent it today.")

# Session "globex": typed entities from an extractor, Arabic text, and a Sarah Chen of its own.
GLOBEX_TURNS = (
    ("Omar Haddad from Globex asked about renewing support.", "I will send Omar Haddad options."),
    ("أحمد من Globex يسأل عن العرض.", "سأرسل العرض إلى أحمد."),
    ("Sarah Chen met Omar Haddad at the fair.", "Good to know."),
)
TYPES = {"Omar Haddad": "PERSON", "Globex": "ORG", "أحمد": "PERSON", "Sarah Chen": "PERSON"}

# Session "quiet": one turn that names nobody.
QUIET_TURN = ("Hello there.", "Hi, how can I help?")

SESSIONS = ("acme", "globex", "quiet")
ACME_ENTITIES = ["Acme Corp", "Sarah Chen", "Berlin"]
GLOBEX_ENTITIES = ["Omar Haddad", "Globex", "أحمد", "Sarah Chen"]

Maker = Callable[..., ConversationEntityMemory]


def url_maker(url: str) -> Maker:
    """A memory factory on ``url`` (the caller closes what it makes)."""

    def make(*args: Any, **kwargs: Any) -> ConversationEntityMemory:
        kwargs.setdefault("database_url", url)
        return ConversationEntityMemory(*args, **kwargs)

    return make


def populate(make: Maker, *, suffix: str = "") -> None:
    """Write the sessions "acme", "globex" and "quiet" (each name + ``suffix``)."""
    acme = make(KeywordLLM(VOCABULARY), session_id="acme" + suffix)
    broken = make(BrokenLLM(), session_id="acme" + suffix)
    typed = make(extractor=TypedExtractor(TYPES), session_id="globex" + suffix)
    quiet = make(KeywordLLM(VOCABULARY), session_id="quiet" + suffix)
    try:
        for user, assistant in ACME_TURNS:
            acme.save_context({"input": user}, {"output": assistant})
        user, assistant = ACME_KEYED_TURN
        acme.save_context({"input": user}, {"output": assistant}, idempotency_key="turn-4")
        user, assistant = ACME_FAILED_TURN
        broken.save_context({"input": user}, {"output": assistant})
        acme.entity_store["Acme Corp"].add_context(ACME_NOTE)
        user, assistant = ACME_LAST_TURN
        acme.save_context({"input": user}, {"output": assistant})
        for user, assistant in GLOBEX_TURNS:
            typed.save_context({"input": user}, {"output": assistant})
        user, assistant = QUIET_TURN
        quiet.save_context({"input": user}, {"output": assistant})
    finally:
        for memory in (acme, broken, typed, quiet):
            memory.close()


def text(turn: tuple[str, str]) -> str:
    return f"{turn[0]} {turn[1]}"


# -- running the command ------------------------------------------------------------------


def invoke(url: str | None, *args: str, input: str | None = None, terminal: bool = False) -> Result:
    """``zerda-store [--database-url URL] ARGS`` in-process, without the caller's
    environment variable. With ``terminal`` output is written as to a terminal (click
    leaves ANSI sequences in, which it strips from output to a pipe)."""
    runner = CliRunner(env={DATABASE_URL_ENV: None})
    prefix = ["--database-url", url] if url is not None else []
    return runner.invoke(main, [*prefix, *args], input=input, color=terminal)


def succeeded(result: Result) -> Result:
    assert result.exit_code == 0, (
        f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}\n"
        f"exception: {result.exception!r}"
    )
    return result


def one_line_error(result: Result) -> str:
    """The single error line of an expected failure; fails on a traceback or a zero exit."""
    assert result.exit_code != 0, f"expected a failure, got exit 0: {result.output}"
    assert isinstance(result.exception, SystemExit), (
        f"an uncaught {type(result.exception).__name__}: {result.exception}"
    )
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {result.stderr!r}"
    assert lines[0].startswith("Error: ")
    return lines[0]


def usage_error(result: Result) -> str:
    """The error line of a usage error (exit 2, click's style: the command's usage line,
    a hint, then the error); fails on a traceback or another exit code."""
    assert result.exit_code == 2, (
        f"expected a usage error, got exit {result.exit_code}: {result.output}{result.exception!r}"
    )
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Usage: "), result.stderr
    assert lines[-1].startswith("Error: "), result.stderr
    return lines[-1]


def json_of(result: Result) -> Any:
    return json.loads(succeeded(result).stdout)


def table_rows(output: str) -> list[list[str]]:
    """A printed table as rows of cells (columns are separated by two or more spaces)."""
    return [re.split(r"\s{2,}", line.strip()) for line in output.splitlines() if line.strip()]


def console_script() -> str:
    """The installed ``zerda-store`` script of this interpreter's environment."""
    beside = Path(sys.executable).parent / "zerda-store"
    if beside.exists():
        return str(beside)
    found = shutil.which("zerda-store")
    assert found, "the zerda-store console script is not installed"
    return found


# -- id-free views of a session --------------------------------------------------------------


def export_records(url: str, session_id: str) -> list[dict[str, Any]]:
    """The records ``export`` writes for a session (header and end line excluded)."""
    result = succeeded(invoke(url, "export", "--session", session_id, "-o", "-"))
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert {k: lines[0][k] for k in ("kind", "session_id", "format")} == {
        "kind": "session",
        "session_id": session_id,
        "format": 3,
    }
    assert lines[-1]["kind"] == "end"
    return lines[1:-1]


def canonical(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with every id replaced by what it refers to: turns by their place in turn
    order, entities by their key; a snippet's recency by the number of turns before it."""
    turn_ids = sorted(r["id"] for r in records if r["kind"] == "turn")
    entity_keys = {r["id"]: r["name_key"] for r in records if r["kind"] == "entity"}

    def place(turn_id: int) -> int:
        return sum(1 for i in turn_ids if i <= turn_id)

    out = []
    for record in records:
        record = dict(record)
        record.pop("id", None)
        if record["kind"] == "alias":
            record["entity_id"] = entity_keys[record["entity_id"]]
        if record["kind"] == "entity":
            record["first_turn_id"] = place(record["first_turn_id"])
        elif record["kind"] == "context":
            record["entity_id"] = entity_keys[record["entity_id"]]
            if record["turn_id"] is not None:
                record["turn_id"] = place(record["turn_id"])
            record["turn_seq"] = place(record["turn_seq"])
        out.append(record)
    return out


def api_view(url: str, session_id: str) -> dict[str, Any]:
    """What the Python API shows of a session."""
    with ConversationEntityMemory(
        KeywordLLM(VOCABULARY), database_url=url, session_id=session_id
    ) as memory:
        names = memory.list_entities()
        stats = memory.get_memory_stats()
        return {
            "chat_memory": list(memory.chat_memory),
            "list_entities": names,
            "entity_info": {name: memory.get_entity_info(name) for name in names},
            "contexts": {name: memory.entity_store[name].contexts for name in names},
            "recall": [
                memory.load_memory_variables({"input": question})
                for question in (
                    "What did Sarah Chen ask for?",
                    "Any news from Globex or Acme Corp?",
                    "Is أحمد in Berlin?",
                )
            ],
            "counts": {k: stats[k] for k in ("entity_count", "message_count", "total_contexts")},
        }


# -- SQL ---------------------------------------------------------------------------------


def session_row_counts(url: str, session_id: str) -> dict[str, int]:
    """Rows of the session in every table that has a session_id column."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        inspector = sa.inspect(engine)
        counts = {}
        with engine.connect() as connection:
            for table in inspector.get_table_names():
                columns = {c["name"] for c in inspector.get_columns(table)}
                if "session_id" in columns:
                    counts[table] = connection.execute(
                        sa.text(f"SELECT COUNT(*) FROM {table} WHERE session_id = :s"),
                        {"s": session_id},
                    ).scalar_one()
        return counts
    finally:
        engine.dispose()


def key(name: str) -> str:
    return name_key(name)
