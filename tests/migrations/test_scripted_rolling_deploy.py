"""One rolling deploy, scripted end to end as an operator runs it, on both backends, with
probes calling throughout:

1. a server of the released version (0.1.0, revision 0004) running, saving;
2. ``zerda-store db upgrade`` while it saves;
3. a restart of the released version: refused (it predates the compatibility floor, and
   refuses any revision it does not know), while the server already running keeps saving;
4. this release starting beside it (a new ``Store`` and memory), both saving;
5. the released server stopped, then ``db rekey`` and ``db contract``;
6. a later release's expansion (test_compatibility_floor's test-only revision beyond
   head), and this release restarting on the expanded schema.

The probes are threads that call round after round, recording when each call began, how
long it waited and what error it met: the released server saving and recalling; from
step 4 on, memories of this release saving and recalling, one sync and one async; from
``db upgrade`` on, an operator reading ``zerda-store sessions`` and ``stats``. Every save a
probe was told succeeded must be stored once and recalled, and no probe may meet an error.
The waits are printed (``pytest -s``), not bounded: this machine's load alone moves them.

Bounded: about a second of calls after each step; well under a minute per backend."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
from alembic import command
from alembic.config import Config

from tests.cli.helpers import invoke
from tests.doubles import ListedNames
from tests.migrations.released import released_database, rows
from tests.migrations.released_process import (
    REPOSITORY,
    SERVER,
    ReleasedServer,
    clean_environment,
    released_python,
)
from tests.migrations.test_compatibility_floor import EXPAND, later_release  # noqa: F401
from zerda_store import ConversationEntityMemory, Store, migrate

pytestmark = pytest.mark.slow

SESSION = "crm"
SETTLE_S = 1.0  # how long the probes call after each step before the next one begins
PAUSE_S = 0.01  # between two rounds of one probe
HEADER = "Previous information about "
RECALL_BATCH = 200  # names per recall in the final check


class ProbeError(Exception):
    """What a call answered instead of succeeding."""


@dataclass(frozen=True)
class Call:
    operation: str
    began: float  # epoch seconds
    seconds: float
    error: str | None


Timer = Callable[[str, Callable[[], object]], bool]


class Client(Protocol):
    """What a probe drives: an application server, or an operator."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def round(self, n: int, timed: Timer) -> list[str]:
        """One round of calls, each through ``timed``; the names of the saves acknowledged."""
        ...


class Probe:
    """A thread calling its client round after round until stopped. ``calls``: each call's
    start, wait and error (opening and restarting the client too); ``saved``: the names of
    the saves acknowledged."""

    def __init__(self, name: str, client: Client) -> None:
        self.name = name
        self.client = client
        self.calls: list[Call] = []
        self.saved: list[str] = []
        self._stopping = threading.Event()
        self._opened = threading.Event()
        self._restart = threading.Event()
        self._restarted = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._opened.wait(timeout=120)

    def restart(self) -> None:
        """Restart the client between two rounds, as a process restarts, and wait for it."""
        if not self._thread.is_alive():
            return
        self._restarted.clear()
        self._restart.set()
        self._restarted.wait(timeout=120)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=120)

    def timed(self, operation: str, call: Callable[[], object]) -> bool:
        began, started = time.time(), time.monotonic()
        error = None
        try:
            call()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        self.calls.append(Call(operation, began, time.monotonic() - started, error))
        return error is None

    def _run(self) -> None:
        opened = self.timed("start", self.client.open)
        self._opened.set()
        if not opened:
            return
        n = 0
        while not self._stopping.is_set():
            if self._restart.is_set():
                self._restart.clear()
                self.timed("restart", self._reopen)
                self._restarted.set()
            self.saved += self.client.round(n, self.timed)
            n += 1
            self._stopping.wait(PAUSE_S)
        self.timed("stop", self.client.close)

    def _reopen(self) -> None:
        self.client.close()
        self.client.open()


# -- the application servers -----------------------------------------------------------------


class Writer:
    """A server saving a turn that names one new entity (``prefix N``) each round, then
    recalling that entity, whose recall must hold the turn's snippet."""

    prefix = ""

    def input_text(self, name: str) -> str:
        raise NotImplementedError

    def save(self, name: str) -> None:
        raise NotImplementedError

    def recall(self, name: str) -> str:
        """The ``entity_info`` recalled for ``name``."""
        raise NotImplementedError

    def snippet(self, name: str) -> str:
        return f"{self.input_text(name)} noted"

    def round(self, n: int, timed: Timer) -> list[str]:
        name = f"{self.prefix} {n}"
        if not timed("save", lambda: self.save(name)):
            return []
        timed("recall", lambda: self._recalls(name))
        return [name]

    def _recalls(self, name: str) -> None:
        recalled = recalled_snippets(self.recall(name))
        if self.snippet(name) not in recalled.get(name, []):
            raise ProbeError(f"the recall of {name!r} misses its turn: {recalled}")


class Released(Writer):
    """A server process of the released version, its memory open on ``SESSION``."""

    prefix = "Ada"

    def __init__(self, database_url: str, workdir: Path) -> None:
        self.url = database_url
        self.workdir = workdir

    def open(self) -> None:
        self.server = ReleasedServer(self.url, SESSION, self.workdir)

    def close(self) -> None:
        self.server.close()

    def input_text(self, name: str) -> str:
        return f"{name} called"  # what the released server's script saves

    def save(self, name: str) -> None:
        answer = self.server.ask(f"save {name}")
        if answer != "saved":
            raise ProbeError(answer)

    def recall(self, name: str) -> str:
        answer = self.server.ask(f"load {name}")
        if not isinstance(answer, str):
            raise ProbeError(answer)
        return answer


class ThisRelease(Writer):
    """A server of this release: a ``Store`` and a memory on ``SESSION``, sync calls."""

    prefix = "Grace"

    def __init__(self, database_url: str) -> None:
        self.url = database_url

    def open(self) -> None:
        self.store = Store(self.url)
        self.memory = ConversationEntityMemory(
            extractor=ListedNames(), store=self.store, session_id=SESSION
        )

    def close(self) -> None:
        self.store.close()

    def input_text(self, name: str) -> str:
        return f"{name} | called"

    def save(self, name: str) -> None:
        self.memory.save_context({"input": self.input_text(name)}, {"output": "noted"})

    def recall(self, name: str) -> str:
        return str(self.memory.load_memory_variables({"input": f"{name} | ?"})["entity_info"])


class ThisReleaseAsync(ThisRelease):
    """A server of this release calling the async twins, on an event loop of its own."""

    prefix = "Hedy"

    def open(self) -> None:
        self.loop = asyncio.new_event_loop()
        super().open()

    def close(self) -> None:
        self.loop.run_until_complete(self.store.aclose())
        self.loop.close()

    def save(self, name: str) -> None:
        self.loop.run_until_complete(
            self.memory.asave_context({"input": self.input_text(name)}, {"output": "noted"})
        )

    def recall(self, name: str) -> str:
        recalled = self.loop.run_until_complete(
            self.memory.aload_memory_variables({"input": f"{name} | ?"})
        )
        return str(recalled["entity_info"])


class Operator:
    """An operator reading with this release's command line: ``sessions`` and ``stats``
    (whose turn count must never go back)."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self.messages = 0

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def round(self, n: int, timed: Timer) -> list[str]:
        timed("sessions", self._sessions)
        timed("stats", self._stats)
        return []

    def _read(self, *args: str) -> Any:
        result = invoke(self.url, *args, "--json")
        if result.exit_code != 0:
            raise ProbeError(result.stderr.strip() or repr(result.exception))
        return json.loads(result.stdout)

    def _sessions(self) -> None:
        listed = [row["session_id"] for row in self._read("sessions")]
        if SESSION not in listed:
            raise ProbeError(f"{SESSION!r} is not listed: {listed}")

    def _stats(self) -> None:
        messages = self._read("stats", "--session", SESSION)["message_count"]
        if messages < self.messages:
            raise ProbeError(f"message_count went back from {self.messages} to {messages}")
        self.messages = messages


def recalled_snippets(entity_info: str) -> dict[str, list[str]]:
    """The snippets of each entity's block of a recall, by the name in its header."""
    blocks: dict[str, list[str]] = {}
    for block in entity_info.split("\n\n"):
        header, *snippets = block.split("\n")
        if header.startswith(HEADER) and header.endswith(":"):
            blocks[header[len(HEADER) : -1]] = snippets
    return blocks


# -- the operator's steps ----------------------------------------------------------------------


@dataclass
class Step:
    name: str
    began: float  # epoch seconds
    seconds: float = 0.0


@dataclass
class Runbook:
    """The operator's steps, one after another, each timed; the probes call ``SETTLE_S``
    after each before the next begins."""

    url: str
    steps: list[Step] = field(default_factory=list)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        step = Step(name, time.time())
        self.steps.append(step)
        started = time.monotonic()
        yield
        step.seconds = time.monotonic() - started
        time.sleep(SETTLE_S)

    def zerda_store(self, *args: str) -> Any:
        """``zerda-store --database-url URL ARGS --json`` in a process of its own, as a
        deploy job runs it; what it printed."""
        done = subprocess.run(
            [sys.executable, "-m", "zerda_store", "--database-url", self.url, *args, "--json"],
            capture_output=True, text=True, encoding="utf-8", timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
        )  # fmt: skip
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stderr}"
        return json.loads(done.stdout)


def restart_released(database_url: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """A new process of the released version opening its memory on the database (and,
    should it start, exiting at once: it is given no command)."""
    script = workdir / "restarted_server.py"
    script.write_text(SERVER, encoding="utf-8")
    return subprocess.run(
        [str(released_python()), str(script), database_url, SESSION],
        input="", capture_output=True, text=True, encoding="utf-8", timeout=120,
        cwd=workdir, env=clean_environment(),
    )  # fmt: skip


def expand(database_url: str, config: Config) -> None:
    """The later release's ``db upgrade`` to its expansion, beyond this release's head."""
    with Store(database_url) as store, migrate.locked_connection(store) as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, EXPAND)


# -- what the run shows ------------------------------------------------------------------------


def waits(runbook: Runbook, probes: Sequence[Probe]) -> str:
    """Each step's time and, for the calls begun from it to the next step, each probe's
    count of calls and errors and its longest wait; then the whole run's."""
    starts = [step.began for step in runbook.steps] + [float("inf")]
    lines = []
    for n, step in enumerate(runbook.steps):
        lines.append(f"{step.name}: {step.seconds:.2f} s")
        for probe in probes:
            calls = [call for call in probe.calls if starts[n] <= call.began < starts[n + 1]]
            if calls:
                lines.append(f"    {probe.name}: {_summary(calls)}")
    lines.append("the whole run:")
    lines += [f"    {probe.name}: {_summary(probe.calls)}" for probe in probes]
    return "\n".join(lines)


def _summary(calls: Sequence[Call]) -> str:
    longest = max(calls, key=lambda call: call.seconds)
    errors = sum(call.error is not None for call in calls)
    return (
        f"{len(calls)} calls, {errors} errors, longest wait {longest.seconds:.3f} s "
        f"({longest.operation})"
    )


def missing_or_repeated(database_url: str, writers: Sequence[tuple[Writer, Probe]]) -> list[str]:
    """The acknowledged saves whose turn is not stored exactly once, or whose snippet a
    recall of this release (on the schema as the run left it) does not return once."""
    wrong = []
    with Store(database_url) as store:
        turns = dict(
            rows(
                store,
                "SELECT input_text, COUNT(*) FROM turns WHERE session_id = :s GROUP BY input_text",
                s=SESSION,
            )
        )
        memory = ConversationEntityMemory(extractor=ListedNames(), store=store, session_id=SESSION)
        for writer, probe in writers:
            wrong += [
                f"{name}: {turns.get(writer.input_text(name), 0)} turns"
                for name in probe.saved
                if turns.get(writer.input_text(name)) != 1
            ]
            for start in range(0, len(probe.saved), RECALL_BATCH):
                names = probe.saved[start : start + RECALL_BATCH]
                question = {"input": ", ".join(names) + " | ?"}
                recalled = recalled_snippets(memory.load_memory_variables(question)["entity_info"])
                wrong += [
                    f"{name}: recalled {recalled.get(name)}"
                    for name in names
                    if recalled.get(name) != [writer.snippet(name)]
                ]
    return wrong


def test_a_rolling_deploy_keeps_every_save_and_fails_only_the_released_restart(
    empty_database_url: str,
    tmp_path: Path,
    later_release: Config,  # noqa: F811
) -> None:
    url = empty_database_url
    released_python()  # installed before the run, on first use
    with Store(url) as store:
        released_database(store)
    runbook = Runbook(url)
    released, sync, async_ = Released(url, tmp_path), ThisRelease(url), ThisReleaseAsync(url)
    released_probe = Probe("released server", released)
    sync_probe = Probe("this release, sync", sync)
    async_probe = Probe("this release, async", async_)
    operator = Probe("operator reading", Operator(url))
    probes = [released_probe, operator, sync_probe, async_probe]
    try:
        with runbook.step("1. the released version running"):
            released_probe.start()
        with runbook.step("2. db upgrade"):
            upgraded = runbook.zerda_store("db", "upgrade")
            operator.start()  # this release's command line reads a schema at its head
        with runbook.step("3. the released version restarting"):
            refused = restart_released(url, tmp_path)
        with runbook.step("4. this release starting beside it"):
            sync_probe.start()
            async_probe.start()
        with runbook.step("5. the released version stopped"):
            released_probe.stop()
        with runbook.step("5. db rekey"):
            rekeyed = runbook.zerda_store("db", "rekey")
        with runbook.step("5. db contract"):
            contracted = runbook.zerda_store("db", "contract")
        with runbook.step("6. a later release expands the schema"):
            expand(url, later_release)
        with runbook.step("6. this release restarting on it"):
            sync_probe.restart()
            async_probe.restart()
    finally:
        for probe in probes:
            probe.stop()
    print(f"\nrolling deploy on {url.partition(':')[0]}\n{waits(runbook, probes)}")

    head = migrate.head_revision()
    assert upgraded["revision"] == head
    # The released version predates the compatibility floor: it refuses any revision it
    # does not know, loudly, naming the revision; the server already running goes on.
    assert refused.returncode != 0 and "ready" not in refused.stdout
    assert refused.stderr.strip().splitlines()[-1] == (
        f"zerda_store.engine.SchemaNotCurrentError: the database schema is at revision "
        f"{head}, which this version of zerda_store does not know: it was migrated by a "
        "newer version"
    )
    restart = runbook.steps[2]
    assert _saves_from(released_probe, restart.began + restart.seconds) > 0
    # db rekey gave keys to the entities the released server saved after db upgrade.
    upgraded_at = runbook.steps[1].began + runbook.steps[1].seconds
    after_upgrade = _saves_from(released_probe, upgraded_at)
    rekeyed_entities = sum(session["rekeyed"] or 0 for session in rekeyed["sessions"])
    assert after_upgrade <= rekeyed_entities <= len(released_probe.saved)
    assert contracted == {"dropped_defaults": ["contexts.created_at", "entities.core_key"]}
    with Store(url) as store:
        assert migrate.current_revision(store) == EXPAND
    restarted = runbook.steps[-1].began
    assert _saves_from(sync_probe, restarted) > 0 and _saves_from(async_probe, restarted) > 0
    assert operator.calls and all(
        probe.saved for probe in (released_probe, sync_probe, async_probe)
    )

    errors = [(probe.name, call) for probe in probes for call in probe.calls if call.error]
    assert errors == []
    writers = [(released, released_probe), (sync, sync_probe), (async_, async_probe)]
    assert missing_or_repeated(url, writers) == []


def _saves_from(probe: Probe, since: float) -> int:
    """The probe's saves acknowledged among those begun at ``since`` (epoch seconds) or later."""
    return sum(
        call.operation == "save" and call.error is None and call.began >= since
        for call in probe.calls
    )
