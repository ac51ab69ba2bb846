"""`import`, `export` and `copy` show one progress bar counting rows against their total
when standard error is a terminal, and print nothing of it otherwise (SQLite and Postgres).

The terminal is a real pseudo-terminal: the command runs in its own process with standard
error on it, as an operator's shell would run it."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

from tests.cli.helpers import invoke, populate, succeeded, url_maker

REPOSITORY = Path(__file__).resolve().parents[2]


def on_a_terminal(*arguments: str) -> str:
    """What the command writes to standard error when that is a terminal."""
    leader, follower = pty.openpty()
    # A terminal 200 columns wide (a new pseudo-terminal has none, and a bar fits in none).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "zerda_store", *arguments],
            cwd=REPOSITORY,
            env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=120,
            check=False,
        )
        os.close(follower)
        follower = -1
        written = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal is closed once everything was read
                break
            if not chunk:
                break
            written += chunk
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    assert completed.returncode == 0, written.decode(errors="replace")
    return written.decode(errors="replace")


def final_count(shown: str, description: str) -> tuple[int, int]:
    """The last "done/total" the bar of ``description`` showed."""
    counts = re.findall(rf"{description}: .*?(\d+)/(\d+) \[", shown)
    assert counts, shown
    done, total = counts[-1]
    return int(done), int(total)


def test_import_export_and_copy_count_rows_against_their_total_on_a_terminal(
    database_url, tmp_path
):
    source = f"sqlite:///{tmp_path / 'source.db'}"
    populate(url_maker(source))
    path = tmp_path / "acme.jsonl"
    succeeded(invoke(source, "export", "--session", "acme", "-o", str(path)))
    records = len(path.read_text(encoding="utf-8").splitlines()) - 2  # header and end line

    exported = on_a_terminal("--database-url", source, "export", "--session", "acme", "-o", "-")
    imported = on_a_terminal("--database-url", database_url, "import", str(path), "--session", "a2")
    copied = on_a_terminal("--database-url", source, "copy", "--to", database_url)

    assert final_count(exported, "export") == (records, records)
    assert final_count(imported, "import") == (records, records)
    done, total = final_count(copied, "copy")
    assert done == total > records  # every session's rows, not a count of sessions
    assert "rows" in copied


def test_no_bar_is_printed_when_standard_error_is_not_a_terminal(database_url, tmp_path):
    source = f"sqlite:///{tmp_path / 'source.db'}"
    populate(url_maker(source))
    path = tmp_path / "acme.jsonl"

    exported = succeeded(invoke(source, "export", "--session", "acme", "-o", str(path)))
    imported = succeeded(invoke(database_url, "import", str(path), "--session", "a2"))
    copied = succeeded(invoke(source, "copy", "--to", database_url))

    assert exported.stderr == "exported session 'acme': " + exported.stderr.split(": ", 1)[1]
    assert exported.stderr.count("\n") == 1
    assert imported.stderr == ""
    assert copied.stderr == ""
