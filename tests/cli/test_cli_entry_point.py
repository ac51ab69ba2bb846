"""The installed `zerda-store` script, run as a real process: the entry point works, reads
the URL from the environment, pipes an export into an import, and fails in one line."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.cli.helpers import (
    SESSIONS,
    canonical,
    console_script,
    export_records,
    populate,
    url_maker,
)
from zerda_store.db.connections.urls import DATABASE_URL_ENV


def run(*args: str, url: str | None = None, stdin: str | None = None, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != DATABASE_URL_ENV}
    if url is not None:
        env[DATABASE_URL_ENV] = url
    return subprocess.run(
        [console_script(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


@pytest.fixture(scope="module")
def sqlite_file(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('entry') / 'memory.db'}"
    populate(url_maker(url))
    return url


def test_the_script_shows_its_help():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: zerda-store ")
    for command in ("db", "sessions", "entities", "entity", "stats", "export", "import"):
        assert f"  {command} " in result.stdout


def test_the_script_reads_the_url_from_the_environment(sqlite_file):
    sessions = run("sessions", "--json", url=sqlite_file)
    assert sessions.returncode == 0, sessions.stderr
    assert [row["session_id"] for row in json.loads(sessions.stdout)] == list(SESSIONS)

    entity = run(
        "--database-url", sqlite_file, "entity", "sarah chen", "--session", "acme", "--json"
    )
    assert entity.returncode == 0, entity.stderr
    assert json.loads(entity.stdout)["name"] == "Sarah Chen"


def test_an_export_piped_into_an_import(sqlite_file):
    exported = run("--database-url", sqlite_file, "export", "--session", "globex", "-o", "-")
    assert exported.returncode == 0, exported.stderr
    assert "Traceback" not in exported.stderr

    imported = run(
        "--database-url", sqlite_file, "import", "-", "--session", "piped", stdin=exported.stdout
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "imported into 'piped': 3 turns, 4 entities, 6 snippets"
    assert canonical(export_records(sqlite_file, "piped")) == canonical(
        export_records(sqlite_file, "globex")
    )


def test_an_expected_failure_is_one_line_on_stderr():
    result = run("--database-url", "postgresql://u:secret@127.0.0.1:1/x", "sessions")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert "secret" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert "cannot connect" in lines[0]


def test_a_url_of_another_database_is_a_usage_error_without_its_secret():
    result = run("--database-url", "nosuchdb://u:secret@x/y", "sessions")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert "secret" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Usage: zerda-store sessions")
    assert lines[-1].startswith("Error: ")
    assert "nosuchdb" in lines[-1]


def test_a_missing_entity_is_one_line_on_stderr(sqlite_file):
    result = run("--database-url", sqlite_file, "entity", "Nobody", "--session", "acme")
    assert result.returncode == 1
    assert result.stderr.strip() == "Error: no entity 'Nobody' in session 'acme'"
