"""Operations of several statements on one session (forgetting an entity, clearing the
session, importing into it, copying it) serialize with the session's saves and with each
other: run at the same time, they leave the session as if they had run one after another
(SQLite, and Postgres at READ COMMITTED).

Two invariants hold after every write of a session:

* every name in a turn's ``entity_names`` is reachable: the session has an entity of that
  key with a snippet of that turn;
* every entity of the session has at least one snippet.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, succeeded
from tests.doubles import KeywordLLM, VocabularyExtractor
from tests.reliability.helpers import inspect_database, table_counts
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.connections.urls import DATABASE_URL_ENV
from zerda_store.db.schema import contexts, entities, turns
from zerda_store.model.names import name_key

WRITERS = 3
SAVES_PER_ROUND = 6
# Rounds of the operation that races the writers: each round before the fix left several
# broken rows on Postgres (a clear's window is shorter than a forget's, so it takes more).
FORGET_ROUNDS = 6
CLEAR_ROUNDS = 20
# Only a guard against a hang; a healthy test takes a few seconds.
HANG_GUARD_SECONDS = 60
SESSION = "crm-serial"
FORGOTTEN = "Ada North"
OTHERS = ("Bo Middle", "Cy Middle", "Zed South")


# -- the invariants -------------------------------------------------------------------


def unreachable_names(connection: sa.Connection, session_id: str) -> list[tuple[int, str]]:
    """(turn id, name) for every name of a turn's entity_names that has no entity of its
    key in the session, or whose entity has no snippet of that turn."""
    entity_ids = dict(
        connection.execute(
            sa.select(entities.c.name_key, entities.c.id).where(entities.c.session_id == session_id)
        ).all()
    )
    snippets = set(
        connection.execute(
            sa.select(contexts.c.entity_id, contexts.c.turn_id).where(
                contexts.c.session_id == session_id
            )
        ).all()
    )
    rows = connection.execute(
        sa.select(turns.c.id, turns.c.entity_names).where(turns.c.session_id == session_id)
    ).all()
    return [
        (turn_id, name)
        for turn_id, names in rows
        for name in names
        if (entity_ids.get(name_key(name)), turn_id) not in snippets
    ]


def entities_without_snippets(connection: sa.Connection, session_id: str) -> list[str]:
    has_snippets = sa.exists().where(contexts.c.entity_id == entities.c.id)
    return list(
        connection.execute(
            sa.select(entities.c.name).where(entities.c.session_id == session_id, ~has_snippets)
        ).scalars()
    )


def assert_session_consistent(url: str, session_id: str) -> None:
    with inspect_database(url) as connection:
        unreachable = unreachable_names(connection, session_id)
        snippetless = entities_without_snippets(connection, session_id)
    assert unreachable == [], f"{len(unreachable)} names of turns lead nowhere: {unreachable[:5]}"
    assert snippetless == [], f"{len(snippetless)} entities without a snippet: {snippetless[:5]}"


# -- writers that save while the test does something else --------------------------------


class Writers:
    """``WRITERS`` threads, each with its own memory on one shared store, running chat
    turns (a recall, then a save) until stopped."""

    def __init__(self, store: Store, turn: Callable[[int, int], str]) -> None:
        self.count = 0
        self.errors: list[str] = []
        self._turn = turn
        self._stop = threading.Event()
        self._saved = threading.Condition()
        extractor = NamesAndClients([FORGOTTEN, *OTHERS])
        self._memories = [
            ConversationEntityMemory(extractor=extractor, store=store, session_id=SESSION)
            for _ in range(WRITERS)
        ]
        self._threads = [
            threading.Thread(target=self._write, args=(number,), daemon=True)
            for number in range(WRITERS)
        ]

    def __enter__(self) -> Writers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(HANG_GUARD_SECONDS)
        assert not any(thread.is_alive() for thread in self._threads), "a writer hung"

    def _write(self, number: int) -> None:
        memory = self._memories[number]
        index = 0
        while not self._stop.is_set():
            text = self._turn(number, index)
            try:
                memory.load_memory_variables({"input": text})  # a chat turn recalls first
                memory.save_context({"input": text}, {"output": "Noted."})
            except Exception as exc:
                self.errors.append(f"writer {number}: {type(exc).__name__}: {exc}")
                return
            with self._saved:
                self.count += 1
                self._saved.notify_all()
            index += 1

    def wait_for_saves(self, count: int) -> None:
        """Block until the writers have saved ``count`` more turns."""
        with self._saved:
            target = self.count + count
            assert self._saved.wait_for(
                lambda: self.count >= target or len(self.errors) == WRITERS, HANG_GUARD_SECONDS
            ), "the writers stopped saving"


class NamesAndClients(VocabularyExtractor):
    """The known names in the text, then every "Client <tag>" (a new entity per turn)."""

    def extract(self, text: str) -> list[str]:
        return [*super().extract(text), *re.findall(r"Client [a-z0-9-]+", text)]


def naming_the_forgotten(number: int, index: int) -> str:
    return f"{FORGOTTEN} met {OTHERS[(number + index) % len(OTHERS)]} (w{number}-{index})."


def naming_a_new_client(number: int, index: int) -> str:
    """A turn that names a client new to the session (every other one, a known entity
    as well)."""
    other = f" and {OTHERS[index % len(OTHERS)]}" if index % 2 else ""
    return f"Client w{number}-{index}{other} asked for a quote."


# -- forget and clear during saves ------------------------------------------------------


@pytest.mark.parametrize("with_turns", [True, False], ids=["with-turns", "names-only"])
def test_forgetting_an_entity_while_turns_naming_it_are_saved_leaves_no_dangling_name(
    database_url: str, with_turns: bool
) -> None:
    store = Store(database_url)
    forgotten: list[str | None] = []
    try:
        memory = ConversationEntityMemory(llm=KeywordLLM([]), store=store, session_id=SESSION)
        with Writers(store, naming_the_forgotten) as writers:
            for _ in range(FORGET_ROUNDS):
                writers.wait_for_saves(SAVES_PER_ROUND)
                receipt = memory.forget_entity(FORGOTTEN, with_turns=with_turns)
                forgotten.append(receipt["entity"])
        saved = writers.count
    finally:
        store.close()

    assert writers.errors == []
    assert saved >= FORGET_ROUNDS * SAVES_PER_ROUND
    assert_session_consistent(database_url, SESSION)
    # Turns naming the entity came between the rounds, so there was something to forget.
    assert forgotten == [FORGOTTEN] * FORGET_ROUNDS


def test_clearing_a_session_while_turns_are_saved_leaves_no_entity_without_a_snippet(
    database_url: str,
) -> None:
    store = Store(database_url)
    left_without_snippets: list[str] = []
    try:
        memory = ConversationEntityMemory(llm=KeywordLLM([]), store=store, session_id=SESSION)
        with (
            Writers(store, naming_a_new_client) as writers,
            inspect_database(database_url) as connection,
        ):
            for _ in range(CLEAR_ROUNDS):
                writers.wait_for_saves(SAVES_PER_ROUND)
                memory.clear()
                # Checked after every clear: the next one would delete what this one left.
                left_without_snippets += entities_without_snippets(connection, SESSION)
                connection.rollback()
        saved = writers.count
    finally:
        store.close()

    assert writers.errors == []
    assert saved >= CLEAR_ROUNDS * SAVES_PER_ROUND
    assert left_without_snippets == [], (
        f"clears left {len(left_without_snippets)} entities without a snippet: "
        f"{left_without_snippets[:5]}"
    )
    assert_session_consistent(database_url, SESSION)


# -- import and copy, as two commands started at once ------------------------------------

# Imports everything, says it is ready, waits for the starting signal, then runs the command.
_JOB = """
import os, sys, time
go, ready = sys.argv.pop(1), sys.argv.pop(1)
from zerda_store.cli import main
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
main()
"""


class Finished(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_together(commands: Sequence[Sequence[str]], folder: Path) -> list[Finished]:
    """Run ``zerda-store`` once per command, all released at the same moment."""
    env = {k: v for k, v in os.environ.items() if k != DATABASE_URL_ENV}
    go = folder / "go"
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", _JOB, str(go), str(folder / f"ready-{number}"), *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for number, command in enumerate(commands)
    ]
    try:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while sum(1 for _ in folder.glob("ready-*")) < len(jobs):
            assert time.monotonic() < deadline, "the commands did not start"
            assert all(job.poll() is None for job in jobs), "a command ended before the start"
            time.sleep(0.01)
        go.touch()
        outputs = [job.communicate(timeout=HANG_GUARD_SECONDS) for job in jobs]
        return [
            Finished(job.returncode, *output) for job, output in zip(jobs, outputs, strict=True)
        ]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()


def _fill(url: str, session_id: str, turns: int) -> None:
    """``turns`` turns in one transaction, each naming two of four entities."""
    vocabulary = [FORGOTTEN, *OTHERS]
    with ConversationEntityMemory(
        llm=KeywordLLM(vocabulary), database_url=url, session_id=session_id
    ) as memory:
        memory.save_contexts(
            (
                {"input": f"Turn {i}: {vocabulary[i % 4]} and {vocabulary[(i + 1) % 4]} met."},
                {"output": "Noted."},
            )
            for i in range(turns)
        )


@pytest.fixture
def commands_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "commands"
    folder.mkdir()
    return folder


IMPORTED_TURNS = 2_500


def test_two_imports_of_one_file_into_one_empty_session_import_it_once(
    database_url: str, tmp_path: Path, commands_folder: Path
) -> None:
    _fill(database_url, "crm-source", IMPORTED_TURNS)
    path = tmp_path / "session.jsonl"
    succeeded(invoke(database_url, "export", "--session", "crm-source", "-o", str(path)))
    with inspect_database(database_url) as connection:
        source = table_counts(connection, "crm-source")
    command = ["--database-url", database_url, "import", str(path), "--session", "crm-target"]

    results = run_together([command, command], commands_folder)

    with inspect_database(database_url) as connection:
        assert table_counts(connection, "crm-target") == source
    assert sorted(result.returncode != 0 for result in results) == [False, True], results
    failed = next(result for result in results if result.returncode != 0)
    assert "Traceback" not in failed.stderr
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), failed.stderr
    assert "crm-target" in lines[0] and "already holds data" in lines[0]


COPIED_SESSIONS = ("crm-a", "crm-b", "crm-c")
COPIED_TURNS = 800


@pytest.fixture
def copy_source(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'source.db'}"
    for session_id in COPIED_SESSIONS:
        _fill(url, session_id, COPIED_TURNS)
    return url


def test_two_copies_into_one_database_copy_each_session_once(
    copy_source: str, database_url: str, commands_folder: Path
) -> None:
    command = ["--database-url", copy_source, "copy", "--to", database_url]

    results = run_together([command, command], commands_folder)

    with inspect_database(copy_source) as connection:
        expected = {s: table_counts(connection, s) for s in COPIED_SESSIONS}
    with inspect_database(database_url) as connection:
        assert {s: table_counts(connection, s) for s in COPIED_SESSIONS} == expected
    assert [result.returncode for result in results] == [0, 0], results
    copied = [
        re.fullmatch(r"copied (\d+) sessions?, skipped (\d+) already present", r.stdout.strip())
        for r in results
    ]
    assert all(copied), results
    assert sum(int(match[1]) for match in copied if match) == len(COPIED_SESSIONS), results
