"""scripts/setup-venv runs pip only when what it installs could change: a second set-up with
the same pyproject.toml and extras skips pip, a changed pyproject.toml or other extras run
it again, and a "dev" set-up also serves a plain one.

The script runs in a copy of the repository's scripts folder, beside a stand-in
`.venv/bin/python` that records its arguments instead of installing anything."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]

RECORDING_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../../pip-calls"
"""


def checkout(tmp_path: Path) -> Path:
    """A folder with scripts/setup-venv, a pyproject.toml and a stand-in .venv."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPOSITORY / "scripts" / "setup-venv", tmp_path / "scripts" / "setup-venv")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(RECORDING_PYTHON)
    python.chmod(0o755)
    return tmp_path


def set_up(folder: Path, *extras: str) -> list[str]:
    """Run the set-up; return the pip commands it ran."""
    calls = folder / "pip-calls"
    calls.unlink(missing_ok=True)
    subprocess.run(
        [str(folder / "scripts" / "setup-venv"), *extras], check=True, capture_output=True
    )
    return calls.read_text().splitlines() if calls.exists() else []


def test_a_second_set_up_with_nothing_changed_skips_pip(tmp_path):
    folder = checkout(tmp_path)

    first = set_up(folder)
    second = set_up(folder)

    assert first[-1] == "-m pip install -q -e ."
    assert second == []


def test_a_changed_pyproject_runs_pip_again(tmp_path):
    folder = checkout(tmp_path)
    set_up(folder)

    (folder / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["y"]\n')

    assert set_up(folder)[-1] == "-m pip install -q -e ."
    assert set_up(folder) == []


def test_other_extras_run_pip_and_a_dev_set_up_serves_a_plain_one(tmp_path):
    folder = checkout(tmp_path)
    set_up(folder)

    dev = set_up(folder, "dev")

    assert dev[-1] == "-m pip install -q -e .[dev,stanza,fastapi]"
    assert set_up(folder, "dev") == []
    assert set_up(folder) == []
