"""Stored text never drives the operator's terminal: in the human-readable output of
`entity`, `entities`, `sessions`, `stats` and `forget`, control characters and bidi
overrides in session ids, names, types and snippets are printed as visible escapes; JSON
output keeps the stored text exactly (SQLite and Postgres)."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.helpers import invoke, json_of, succeeded
from tests.doubles import TypedExtractor

# What a terminal acts on: a CSI colour, an OSC window title ended by BEL, a clear screen,
# BEL, CR, backspace, DEL, the one-byte C1 CSI and NEL, and every bidi embedding, override
# and isolate (they reorder what the operator reads).
CONTROLS = (
    "\x1b[31m \x1b]0;owned\x07 \x1b[2J \x07 \r \x08 \x7f \x9b31m \x85 \t \n"
    " \u202a \u202b \u202c \u202d \u202e \u2066 \u2067 \u2068 \u2069"
)
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
SESSION = f"ops {CONTROLS} end"
# An extractor drops names with control characters, and clips such types to "unknown";
# the bidi characters are neither, so they reach both.
NAME = f"Mallory {BIDI}exe.txt"
TYPE = f"PERSON{BIDI}"
SNIPPET_INPUT = f"Mallory {BIDI}exe.txt wrote {CONTROLS} today"
SNIPPET = f"{SNIPPET_INPUT} noted"

# How each of them must show: as text, the way Python writes it in a string literal.
ESCAPES = {
    "\x1b": "\\x1b",
    "\x07": "\\x07",
    "\r": "\\r",
    "\x08": "\\x08",
    "\x7f": "\\x7f",
    "\x9b": "\\x9b",
    "\x85": "\\x85",
    "\t": "\\t",
    "\n": "\\n",
    **{char: f"\\u{ord(char):04x}" for char in BIDI},
}
# Any C0 or C1 control but the line break, and the bidi characters.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def shown(text: str) -> str:
    return "".join(ESCAPES.get(char, char) for char in text)


@pytest.fixture
def hostile(database_url, make_memory) -> str:
    """A database whose one session id, entity name, type and snippet carry controls."""
    memory = make_memory(extractor=TypedExtractor({NAME: TYPE}, name="hostile"), session_id=SESSION)
    memory.save_context({"input": SNIPPET_INPUT}, {"output": "noted"})
    return database_url


def terminal_output(url: str, *args: str) -> str:
    """What the command writes to a terminal (standard output and error)."""
    result = succeeded(invoke(url, *args, terminal=True))
    return result.stdout + result.stderr


def assert_safe(output: str) -> None:
    found = sorted({f"U+{ord(char):04X}" for char in UNSAFE.findall(output)})
    assert not found, f"raw control characters reach the terminal: {found}\n{output!r}"


@pytest.mark.fans_out
@pytest.mark.parametrize("command", [["sessions"], ["stats"], ["stats", "--session", SESSION]])
def test_session_listings_escape_controls_in_session_ids(hostile, command):
    output = terminal_output(hostile, *command)

    assert_safe(output)
    assert shown(SESSION) in output
    assert "\\x1b]0;owned\\x07" in output
    assert "\\x9b31m" in output


def test_entities_escape_bidi_overrides_in_names_and_types(hostile):
    output = terminal_output(hostile, "entities", "--session", SESSION)

    assert_safe(output)
    row = output.splitlines()[1]
    assert row.startswith(f"{shown(NAME)}  {shown(TYPE)}  1  ")
    assert "\\u202e" in row


def test_entity_escapes_its_name_type_and_snippets(hostile):
    output = terminal_output(hostile, "entity", NAME, "--session", SESSION)

    assert_safe(output)
    lines = output.splitlines()
    assert lines[0] == f"{shown(NAME)} ({shown(TYPE)})"
    assert lines[-1] == f"    - {shown(SNIPPET)}"
    assert len(lines) == 6  # a snippet's own line breaks do not start lines of their own
    assert "\\x1b[31m" in lines[-1]


def test_the_forget_receipt_escapes_the_name(hostile):
    output = terminal_output(hostile, "forget", "--yes", NAME, "--session", SESSION)

    assert_safe(output)
    assert output.startswith(f"forgot '{shown(NAME)}': 1 entity, 1 snippet")


@pytest.mark.fans_out
def test_json_output_keeps_the_stored_text_exactly(hostile):
    sessions = succeeded(invoke(hostile, "sessions", "--json", terminal=True)).stdout
    assert [row["session_id"] for row in json.loads(sessions)] == [SESSION]
    assert "\\u001b]0;owned\\u0007" in sessions  # json.dumps escapes C0 controls itself
    result = succeeded(invoke(hostile, "entity", NAME, "--session", SESSION, "--json"))
    info = json.loads(result.stdout)
    assert (info["name"], info["type"], info["recent_contexts"]) == (NAME, TYPE, [SNIPPET])
    assert result.stdout == json.dumps(info, ensure_ascii=False, indent=2) + "\n"
    rows = json_of(invoke(hostile, "entities", "--session", SESSION, "--json"))
    assert [(row["name"], row["type"]) for row in rows] == [(NAME, TYPE)]
    receipt = json_of(invoke(hostile, "forget", "--yes", NAME, "--session", SESSION, "--json"))
    assert receipt["entity"] == NAME
