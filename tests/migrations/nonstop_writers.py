"""Running a schema step against writers that never pause.

``NonStopWriters`` starts application servers in processes of their own, each saving turns
through ``save_context`` back to back (no pause) in the sessions it is given, until told to
stop; every save's time and error is recorded. A server is a release's interpreter: the
released version's (:func:`released_python`, the release that runs while the schema is
upgraded under it) or this checkout's (a release that starts on the upgraded schema).
Afterwards :meth:`NonStopWriters.report` says what the writers saw and what of it the
database lost: an acknowledged save whose turn is missing or has no snippet.

``against_nonstop_writers`` runs one step (``db upgrade``, a revision, ``db rekey``, ``db
contract``) while such writers run, and each new revision's test runs it through
:func:`upgrade_against_nonstop_writers`: the revision must finish with every save
acknowledged and nothing lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

from tests.migrations.released_process import REPOSITORY, clean_environment, released_python
from zerda_store import Store, migrate
from zerda_store.model.names import FOLD_V1

T = TypeVar("T")

# Runs inside a release's environment. Arguments: the database URL, a JSON plan (writer
# name, sessions, names), the file to write each save to, the file whose existence stops
# it. One line per save: [session, name, marker, seconds, error or null, when it began].
WRITER = r"""
import json, os, sys, time
from zerda_store import ConversationEntityMemory, Store

url, plan, out, stop = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]

class NamingLLM:
    name = ""
    def generate(self, prompt, max_tokens=256):
        return self.name

llm = NamingLLM()
store = Store(url)
memories = {s: ConversationEntityMemory(llm=llm, store=store, session_id=s)
            for s in plan["sessions"]}
sessions, names = plan["sessions"], plan["names"]
print("ready", flush=True)
lines, n = [], 0
while not os.path.exists(stop):
    session = sessions[n % len(sessions)]
    name = names[(n // len(sessions)) % len(names)]
    marker = f"{plan['writer']}-{n}"
    llm.name = name
    began, started = time.time(), time.monotonic()
    try:
        memories[session].save_context({"input": f"{name} said {marker}"}, {"output": "noted"})
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    lines.append(json.dumps([session, name, marker, time.monotonic() - started, error, began],
                            ensure_ascii=False))
    n += 1
for memory in memories.values():
    memory.close()
store.close()
with open(out, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
print("done", flush=True)
"""

SLOW_SAVE_S = 1.0  # the bound on a save's wait during any step of an upgrade


@dataclass
class Save:
    session_id: str
    name: str
    marker: str
    seconds: float
    error: str | None
    started_at: float = 0.0  # epoch seconds

    @property
    def input_text(self) -> str:
        return f"{self.name} said {self.marker}"


@dataclass
class WritersReport:
    """What the writers saw, and what the database lost of what they were told was saved."""

    saves: int
    failed: list[str] = field(default_factory=list)
    longest_s: float = 0.0
    over_1s: int = 0
    missing_turns: list[str] = field(default_factory=list)
    lost_snippets: list[str] = field(default_factory=list)

    @property
    def acknowledged(self) -> int:
        return self.saves - len(self.failed)

    def summary(self) -> dict[str, Any]:
        return {
            "saves": self.saves,
            "failed": len(self.failed),
            "first_failure": self.failed[0] if self.failed else None,
            "longest_s": round(self.longest_s, 3),
            "over_1s": self.over_1s,
            "missing_turns": len(self.missing_turns),
            "lost_snippets": len(self.lost_snippets),
        }


class NonStopWriters:
    """``count`` server processes of one release, each saving without pause, round robin
    over ``sessions`` and ``names`` (one name per turn), until the ``with`` block ends."""

    def __init__(
        self,
        database_url: str,
        workdir: Path,
        *,
        sessions: Sequence[str],
        names: Sequence[str],
        release: str = "released",
        count: int = 2,
    ) -> None:
        self.url = database_url
        self.workdir = workdir
        self.sessions = list(sessions)
        self.names = list(names)
        self.release = release
        self.count = count
        self.stop_file = workdir / f"stop-{release}"
        self.outputs = [workdir / f"writer-{release}-{n}.jsonl" for n in range(count)]
        self.processes: list[subprocess.Popen[str]] = []
        self.saves: list[Save] = []

    def _command(self) -> tuple[list[str], dict[str, str]]:
        script = self.workdir / "nonstop_writer.py"
        script.write_text(WRITER, encoding="utf-8")
        if self.release == "released":
            return [str(released_python()), str(script)], clean_environment()
        return [sys.executable, str(script)], {**os.environ, "PYTHONPATH": str(REPOSITORY)}

    def __enter__(self) -> NonStopWriters:
        self.stop_file.unlink(missing_ok=True)
        command, environment = self._command()
        for n, output in enumerate(self.outputs):
            # Each writer starts at another session, so that they meet in all of them.
            sessions = self.sessions[n:] + self.sessions[:n]
            plan = {"writer": f"{self.release[0]}{n}", "sessions": sessions, "names": self.names}
            arguments = [*command, self.url, json.dumps(plan), str(output), str(self.stop_file)]
            self.processes.append(
                subprocess.Popen(
                    arguments,
                    stdout=subprocess.PIPE,
                    text=True,
                    encoding="utf-8",
                    cwd=self.workdir,
                    env=environment,
                )
            )
        for process in self.processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.strip() == "ready", f"a writer did not start ({process.wait()})"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_file.touch()
        for process in self.processes:
            process.wait(timeout=120)
        for output in self.outputs:
            if output.exists():
                text = output.read_text(encoding="utf-8")
                self.saves += [Save(*json.loads(line)) for line in text.splitlines() if line]

    def report(self, store: Store, during: tuple[float, float] | None = None) -> WritersReport:
        """What the writers saw, and which acknowledged saves lost their turn or snippet;
        ``during``: only the saves begun between these two times (epoch seconds)."""
        found = _turns_and_snippets(store, self.sessions)
        saves = [
            save
            for save in self.saves
            if during is None or during[0] <= save.started_at < during[1]
        ]
        report = WritersReport(len(saves))
        for save in saves:
            if save.error is not None:
                report.failed.append(save.error)
                continue
            report.longest_s = max(report.longest_s, save.seconds)
            report.over_1s += save.seconds > SLOW_SAVE_S
            snippets = found.get((save.session_id, save.input_text))
            if snippets is None:
                report.missing_turns.append(save.marker)
            elif snippets == 0:
                report.lost_snippets.append(save.marker)
        return report


def _turns_and_snippets(store: Store, sessions: Sequence[str]) -> dict[tuple[str, str], int]:
    query = sa.text(
        "SELECT t.session_id, t.input_text, "
        "(SELECT COUNT(*) FROM contexts c WHERE c.turn_id = t.id) FROM turns t "
        "WHERE t.input_text LIKE '% said %'"
    )
    wanted = set(sessions)
    with store.connect() as connection:
        return {
            (session_id, text): int(count)
            for session_id, text, count in connection.execute(query)
            if session_id in wanted
        }


class WriteTransactions:
    """The write transactions of a SQLite store's connections (those of a migration): for
    each, the rows it changed (the driver's ``total_changes``) and how long it held the
    write lock (from its ``BEGIN`` having returned to its commit)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.done: list[tuple[int, float]] = []
        self._began: dict[int, tuple[int, float]] = {}
        sa.event.listen(engine, "after_cursor_execute", self._statement)
        sa.event.listen(engine, "commit", self._ended)

    def _statement(
        self, connection: sa.Connection, cursor: object, statement: str, *_: object
    ) -> None:
        verb = statement.lstrip()[:6].upper()
        if verb.startswith("BEGIN"):
            driver: Any = connection.connection.driver_connection
            self._began[id(driver)] = (driver.total_changes, time.monotonic())
        elif verb == "COMMIT":
            self._ended(connection)

    def _ended(self, connection: sa.Connection) -> None:
        driver: Any = connection.connection.driver_connection
        began = self._began.pop(id(driver), None)
        if began is not None:
            changes, at = began
            self.done.append((driver.total_changes - changes, time.monotonic() - at))

    def longest(self) -> dict[str, Any]:
        """The transaction that held the write lock longest: seconds and rows."""
        changed, held = max(self.done, key=lambda done: done[1], default=(0, 0.0))
        return {"transactions": len(self.done), "longest_s": round(held, 3), "its_rows": changed}


def against_nonstop_writers(
    database_url: str,
    workdir: Path,
    step: Callable[[], T],
    *,
    settle: float = 0.5,
    before: Callable[[], object] | None = None,
    **writers: Any,
) -> tuple[T, WritersReport]:
    """Run ``step`` while :class:`NonStopWriters` (``writers``: their arguments) save;
    the writers run ``settle`` seconds before and after it. ``before``: what to run once
    the writers have started, before the step (the released version starts only on its own
    revision: the revisions before the one a test is about run under its writers too).
    Returns the step's result and the writers' report of the saves they began from
    ``settle`` seconds before the step on (those of ``before`` are not the step's)."""
    nonstop = NonStopWriters(database_url, workdir, **writers)
    with nonstop:
        if before is not None:
            before()
        began = time.time()
        time.sleep(settle)
        result = step()
        time.sleep(settle)
    with Store(database_url) as store:
        return result, nonstop.report(store, (began, float("inf")))


def assert_nothing_lost(report: WritersReport) -> None:
    """Every save acknowledged, and every acknowledged save's turn and snippet stored."""
    summary = report.summary()
    assert report.acknowledged > 0, "the writers saved nothing"
    assert (summary["failed"], summary["missing_turns"], summary["lost_snippets"]) == (0, 0, 0), (
        summary
    )


def upgrade_against_nonstop_writers(
    database_url: str, workdir: Path, revision: str, **writers: Any
) -> WritersReport:
    """Upgrade the database to ``revision`` while writers of the previous release (by
    default, started on the database as that release left it and kept running through the
    revisions before ``revision``) save without pause, and check what each new revision
    must do: finish, with no save failed and none lost. Returns the writers' report."""

    def upgrade(to: str) -> Callable[[], None]:
        def run() -> None:
            with Store(database_url) as store:
                migrate.upgrade(store, to)

        return run

    previous = f"{int(revision) - 1:04d}"
    _, report = against_nonstop_writers(
        database_url, workdir, upgrade(revision), before=upgrade(previous), **writers
    )
    with Store(database_url) as store:
        assert migrate.current_revision(store) == revision
    assert_nothing_lost(report)
    return report


# -- a database as the released version left it, in bulk --------------------------------


def fill_released(
    store: Store, *, sessions: int, turns_per_session: int, entities_per_session: int = 20
) -> list[str]:
    """Sessions ``s0``.. of the released version (fold-v1 keys), each with
    ``entities_per_session`` entities ("Müller" and "Muller" among them: one key under
    fold-v2, so that re-keying merges them) and turns naming two of them each, with their
    snippets; returns the session ids. Bulk inserts: 100,000 turns take seconds."""
    names = ["Müller", "Muller"] + [f"Person {n}" for n in range(2, entities_per_session)]
    session_ids = [f"s{n}" for n in range(sessions)]

    def named(t: int) -> list[str]:
        return sorted({names[t % len(names)], names[(t * 7 + 1) % len(names)]})

    with store.connect() as connection, connection.begin():
        connection.execute(
            sa.text(
                "INSERT INTO turns (session_id, input_text, output_text, entity_names, "
                "created_at) VALUES (:session, :text, 'noted', :names, :at)"
            ),
            [{"session": session_id, "text": f"turn {t}", "names": json.dumps(named(t)),
              "at": 1_700_000_000.0 + t}
             for session_id in session_ids for t in range(turns_per_session)],
        )  # fmt: skip
        turn_ids = _ids(connection, "SELECT session_id, id FROM turns ORDER BY id")
        connection.execute(
            sa.text(
                "INSERT INTO entities (session_id, name_key, name, entity_type, first_seen, "
                "last_seen, first_turn_id, first_position) VALUES (:session, :key, :name, "
                "'unknown', :at, :at, :turn, 0)"
            ),
            [{"session": session_id, "key": FOLD_V1.key(name), "name": name,
              "at": 1_700_000_000.0 + n, "turn": turn_ids[session_id][n]}
             for session_id in session_ids for n, name in enumerate(names)],
        )  # fmt: skip
        entity_ids = _ids(connection, "SELECT session_id, id FROM entities ORDER BY id")
        connection.execute(
            sa.text(
                "INSERT INTO contexts (session_id, entity_id, turn_id, turn_seq, text) "
                "VALUES (:session, :entity, :turn, :turn, :text)"
            ),
            [{"session": session_id, "entity": entity_ids[session_id][names.index(name)],
              "turn": turn_id, "text": f"turn {turn_id} about {name}"}
             for session_id in session_ids
             for t, turn_id in enumerate(turn_ids[session_id])
             for name in named(t)],
        )  # fmt: skip
    return session_ids


def _ids(connection: sa.Connection, query: str) -> dict[str, list[int]]:
    """Each session's ids in the order they were inserted."""
    ids: dict[str, list[int]] = {}
    for session_id, id_ in connection.execute(sa.text(query)):
        ids.setdefault(session_id, []).append(int(id_))
    return ids
