"""Every `--json` prints JSON only on standard output (the fourth hardening round: `db
check --json` printed Alembic's "No new upgrade operations detected." before its JSON)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.cli.helpers import console_script, invoke, succeeded

JSON_COMMANDS = [
    ("db", "check", "--json"),
    ("db", "current", "--json"),
    ("sessions", "--json"),
    ("sessions", "--include-expired", "--json"),
    ("entities", "--session", "acme", "--json"),
    ("entities", "--session", "acme", "--similar", "--json"),
    ("entity", "Sarah Chen", "--session", "acme", "--json"),
    ("stats", "--json"),
    ("stats", "--session", "acme", "--json"),
    ("merges", "--session", "acme", "--json"),
    ("alias", "list", "--session", "acme", "--json"),
    ("retention", "show", "--default", "--json"),
    ("prune", "--dry-run", "--json"),
    ("forget", "Berlin", "--session", "acme", "--dry-run", "--json"),
    ("retention", "clear", "--default", "--dry-run", "--json"),
    ("db", "downgrade", "0009", "--dry-run", "--json"),
]


@pytest.mark.fans_out  # lists or copies every session
@pytest.mark.parametrize("args", JSON_COMMANDS, ids=" ".join)
def test_json_prints_json_only(shared_populated, args):
    result = succeeded(invoke(shared_populated, *args))
    json.loads(result.stdout)  # the whole of standard output is one JSON value


def test_db_check_json_from_the_console_script_prints_json_only(shared_populated):
    """In a process of its own: Alembic writes to the process's own standard output,
    which an in-process runner does not capture."""
    done = subprocess.run(
        [console_script(), "--database-url", shared_populated, "db", "check", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "ZERDA_STORE_DATABASE_URL"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "revision": json.loads(done.stdout)["revision"],
        "matches": True,
    }
