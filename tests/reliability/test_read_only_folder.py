"""A SQLite database in a folder this process cannot write to (SQLite): read through
``mode=ro`` while a writer's -wal and -shm files are there, through ``immutable=1`` when
there are none (a closed WAL database keeps everything in the main file), refused when a
-wal file lacks its -shm (reading the main file alone would miss committed turns).

Root ignores folder permissions, so as root the readers run as the user nobody."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cli.helpers import populate, url_maker
from tests.doubles import FixedLLM
from zerda_store import ConversationEntityMemory, Store

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ["acme", "globex", "quiet"]

# Reads the store again for each line on stdin: the sessions, and the turns of "live".
READER = """
import json, sys
from zerda_store import ConversationEntityMemory, Store
from zerda_store.admin import AdminRepository
with Store(sys.argv[1], read_only=True) as store:
    for _ in sys.stdin:
        sessions = [s.session_id for s in AdminRepository(store).sessions()]
        live = ConversationEntityMemory(store=store, session_id="live")
        print(json.dumps([sessions, len(live.chat_memory)]), flush=True)
"""


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder that another user can read (pytest's own temporary folders are private)."""
    made = Path(tempfile.mkdtemp(prefix="zerda-read-only-"))
    made.chmod(0o755)
    try:
        yield made
    finally:
        made.chmod(0o755)
        shutil.rmtree(made)


def as_nobody() -> list[str]:
    """The prefix that runs a command as nobody through setpriv (which drops every
    capability), or a skip where that cannot run this Python."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a folder read-only")
    nobody = pwd.getpwnam("nobody")
    prefix = [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import sqlalchemy"], capture_output=True, cwd="/"
    )
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable}: {probe.stderr[-200:]!r}")
    return prefix


# How the readers start: this checkout's package, nothing of the caller's environment.
ENV = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HOME": "/tmp"}


@contextmanager
def read_only_folder(folder: Path) -> Iterator[list[str]]:
    """Inside: ``folder`` (its files readable) is read-only to commands that start with the
    yielded prefix."""
    for file in folder.iterdir():
        file.chmod(0o644)
    prefix = as_nobody() if os.geteuid() == 0 else []
    folder.chmod(0o555)
    try:
        yield prefix
    finally:
        folder.chmod(0o755)


def cli(folder: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``zerda-store --database-url URL ARGS`` without write access to ``folder``."""
    with read_only_folder(folder) as prefix:
        return subprocess.run(
            [*prefix, sys.executable, "-m", "zerda_store", "--database-url", url, *args],
            env=ENV,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
        )


def listed(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [row.get("session_id") or row["name"] for row in json.loads(result.stdout)]


def fingerprint(path: Path) -> tuple[str, list[str]]:
    """The file's bytes (hashed) and what its folder holds."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(os.listdir(path.parent))


def test_a_closed_wal_database_in_a_read_only_folder_is_read_without_a_trace(folder):
    path = folder / "memory.db"
    url = f"sqlite:///{path}"
    populate(url_maker(url))  # closed: no -wal or -shm file is left
    before = fingerprint(path)

    assert listed(cli(folder, url, "sessions", "--json")) == SESSIONS
    entities = cli(folder, url, "entities", "--session", "acme", "--json")
    assert listed(entities) == ["Acme Corp", "Sarah Chen", "Berlin"]
    assert fingerprint(path) == before  # no -shm was created, not a byte changed


def test_a_reader_in_a_read_only_folder_sees_what_a_live_writer_committed(folder):
    """While a writer has the database open, its -wal and -shm files exist: a reader without
    write access reads them too, and so sees committed turns not yet in the main file."""
    path = folder / "memory.db"
    url = f"sqlite:///{path}"
    populate(url_maker(url))
    with (
        Store(url) as store,
        ConversationEntityMemory(FixedLLM("Ada"), store=store, session_id="live") as writer,
    ):
        writer.save_context({"input": "Ada called"}, {"output": "ok"})
        assert Path(f"{path}-wal").stat().st_size > 0
        assert listed(cli(folder, url, "sessions", "--json")) == ["acme", "globex", "live", "quiet"]


def test_a_long_lived_reader_notices_a_writer_that_starts_after_it(folder):
    """An immutable connection would go on reading the main file alone: a read-only store
    uses one per query, so its next read finds the writer's -wal file and reads it."""
    path = folder / "memory.db"
    url = f"sqlite:///{path}"
    populate(url_maker(url))
    with read_only_folder(folder) as prefix:
        reader = subprocess.Popen(
            [*prefix, sys.executable, "-c", READER, url],
            env=ENV,
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert reader.stdin is not None and reader.stdout is not None
            reader.stdin.write("read\n")
            reader.stdin.flush()
            assert json.loads(reader.stdout.readline()) == [SESSIONS, 0]
            with (
                Store(url) as store,
                ConversationEntityMemory(FixedLLM("Ada"), store=store, session_id="live") as w,
            ):
                w.save_context({"input": "Ada called"}, {"output": "ok"})
                reader.stdin.write("read\n")
                reader.stdin.flush()
                line = reader.stdout.readline()
                assert line, reader.stderr.read() if reader.stderr else ""
                assert json.loads(line) == [["acme", "globex", "live", "quiet"], 1]
            reader.stdin.close()
            assert reader.wait(timeout=60) == 0
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()


def test_a_wal_file_without_its_shm_in_a_read_only_folder_is_refused_not_read_stale(folder):
    """A -wal file without its -shm (left by a crash, or copied) can only be read where
    SQLite may create the -shm; reading the main file alone would miss committed turns."""
    source = folder / "live.db"
    url = f"sqlite:///{source}"
    populate(url_maker(url))
    copy = folder / "copy" / "memory.db"
    copy.parent.mkdir()
    copy.parent.chmod(0o755)
    with (
        Store(url) as store,
        ConversationEntityMemory(FixedLLM("Ada"), store=store, session_id="live") as writer,
    ):
        writer.save_context({"input": "Ada called"}, {"output": "ok"})
        shutil.copy(source, copy)
        shutil.copy(f"{source}-wal", f"{copy}-wal")

    result = cli(copy.parent, f"sqlite:///{copy}", "sessions", "--json")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert "-wal file" in line and "no -shm" in line
    assert "Traceback" not in result.stderr
