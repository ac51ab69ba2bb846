"""The released version (commit ffd4cb9, revision 0004) as a running application server:
installed once into a virtual environment of its own (cached in the temporary directory,
keyed by the commit), and driven line by line over stdin/stdout, so that a test can keep
one of its memories open while the schema is upgraded under it."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

RELEASED_COMMIT = "ffd4cb900b7ca5b628cb32645c5dc650bdff8a60"
REPOSITORY = Path(__file__).resolve().parents[2]

# Runs inside the released environment: one command per line ("save NAME", "load NAME",
# "entities"), one JSON answer per line. Its LLM names whatever the command names.
SERVER = r"""
import json, sys
from zerda_store import ConversationEntityMemory

class NamingLLM:
    name = ""
    def generate(self, prompt, max_tokens=256):
        return self.name

llm = NamingLLM()
memory = ConversationEntityMemory(llm=llm, database_url=sys.argv[1], session_id=sys.argv[2])
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    command, _, name = line.rstrip("\n").partition(" ")
    llm.name = name
    try:
        if command == "save":
            memory.save_context({"input": f"{name} called"}, {"output": "noted"})
            answer = "saved"
        elif command == "load":
            answer = memory.load_memory_variables({"input": f"about {name}"})["entity_info"]
        else:
            answer = memory.list_entities()
    except Exception as exc:
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer, ensure_ascii=False), flush=True)
"""


def released_python() -> Path:
    """The interpreter of a virtual environment holding the released version (built on
    first use: ``git archive`` of the commit, ``python -m venv``, ``pip install``)."""
    home = Path(tempfile.gettempdir()) / f"zerda-store-released-{RELEASED_COMMIT[:12]}"
    python = home / "venv" / "bin" / "python"
    if python.exists():
        return python
    building = Path(tempfile.mkdtemp(prefix="zerda-store-released-"))
    archive = subprocess.run(
        ["git", "-C", str(REPOSITORY), "archive", "--format=tar", RELEASED_COMMIT],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(building / "source", filter="data")
    subprocess.run([sys.executable, "-m", "venv", str(building / "venv")], check=True)
    subprocess.run(
        [str(building / "venv" / "bin" / "pip"), "install", "--quiet",
         f"{building / 'source'}[postgres]"],
        check=True, env=clean_environment(),
    )  # fmt: skip
    try:
        building.rename(home)  # another run may have built it meanwhile: keep theirs
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
    return python


def clean_environment() -> dict[str, str]:
    """Without PYTHONPATH, which would put this checkout's zerda_store before the release's."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


class ReleasedServer:
    """A process of the released version with one memory open on ``session_id``."""

    def __init__(self, database_url: str, session_id: str, workdir: Path) -> None:
        script = workdir / "released_server.py"
        script.write_text(SERVER, encoding="utf-8")
        self.process = subprocess.Popen(
            [str(released_python()), str(script), database_url, session_id],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8",
            cwd=workdir, env=clean_environment(),
        )  # fmt: skip
        assert self._answer() == "ready"

    def _answer(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the released version exited ({self.process.wait()})"
        return json.loads(line)

    def ask(self, command: str) -> Any:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)
