"""`db upgrade|downgrade|current|check`, a schema behind head, unusable URLs, and several
deploy jobs upgrading one fresh Postgres database at once."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from click.testing import CliRunner

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded, usage_error
from tests.doubles import new_postgres_database
from zerda_store import migrate
from zerda_store.cli import main

TABLES = {"turns", "entities", "contexts", "extractions"}
VIEWS = {"entity_overview", "entity_snippets"}


def revisions() -> list[str]:
    """Every revision, oldest first."""
    script = ScriptDirectory.from_config(migrate.alembic_config())
    return [r.revision for r in script.walk_revisions()][::-1]


HEAD = revisions()[-1]


def schema_objects(url: str) -> tuple[set[str], set[str], list[tuple[str, ...]]]:
    """Tables, views and alembic_version rows of a database."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        tables = set(inspector.get_table_names())
        views = set(inspector.get_view_names())
        versions = []
        if "alembic_version" in tables:
            with engine.connect() as connection:
                versions = [
                    tuple(row)
                    for row in connection.exec_driver_sql("SELECT * FROM alembic_version")
                ]
        return tables, views, versions
    finally:
        engine.dispose()


def test_head_is_the_library_head():
    assert migrate.head_revision() == HEAD
    assert len(revisions()) >= 3


def test_db_commands_on_an_empty_database(empty_database_url):
    url = empty_database_url
    if url.startswith("sqlite"):
        assert "no database file" in one_line_error(invoke(url, "db", "current"))
    else:
        assert "an empty database" in succeeded(invoke(url, "db", "current")).stdout

    upgraded = succeeded(invoke(url, "db", "upgrade"))
    assert upgraded.stdout.strip().splitlines()[-1] == f"database at revision {HEAD}"
    tables, views, versions = schema_objects(url)
    assert tables >= TABLES
    assert views >= VIEWS
    assert versions == [(HEAD,)]

    assert succeeded(invoke(url, "db", "current")).stdout.strip() == f"{HEAD} (head)"
    assert "schema matches the code" in succeeded(invoke(url, "db", "check")).stdout

    downgraded = succeeded(invoke(url, "db", "downgrade", "base", "--yes"))
    assert downgraded.stdout.strip().splitlines()[-1] == "database at revision base"
    # only an empty alembic_version is left: nothing of zerda_store's
    assert "no revision: an empty database" in succeeded(invoke(url, "db", "current")).stdout
    tables, views, versions = schema_objects(url)
    assert not tables & TABLES
    assert not views & VIEWS
    assert versions == []

    # and back up again: the downgrade left nothing in the way
    succeeded(invoke(url, "db", "upgrade"))
    assert succeeded(invoke(url, "db", "current")).stdout.strip() == f"{HEAD} (head)"

    # unknown revisions are usage errors that change nothing
    assert "'9999' is no revision" in usage_error(invoke(url, "db", "upgrade", "9999"))
    assert "'nonsense' is no revision" in usage_error(
        invoke(url, "db", "downgrade", "nonsense", "--yes")
    )
    assert succeeded(invoke(url, "db", "current")).stdout.strip() == f"{HEAD} (head)"

    # check notices tables that differ from the code
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE turns ADD COLUMN surprise INTEGER")
    engine.dispose()
    result = invoke(url, "db", "check")
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    assert "schema differs from the code" in result.stderr
    assert "the table turns has a column surprise (INTEGER) that the code does not define" in (
        result.stderr
    )
    assert "Column(" not in result.stderr and "table=<" not in result.stderr


def test_upgrade_and_downgrade_one_revision_at_a_time(empty_database_url):
    url = empty_database_url
    for revision in revisions():
        succeeded(invoke(url, "db", "upgrade", revision))
        expected = "(head)" if revision == HEAD else f"(head is {HEAD})"
        assert succeeded(invoke(url, "db", "current")).stdout.strip() == f"{revision} {expected}"
    for revision in revisions()[-2::-1]:
        succeeded(invoke(url, "db", "downgrade", revision, "--yes"))
        assert succeeded(invoke(url, "db", "current")).stdout.strip().split()[0] == revision


def test_downgrade_needs_a_revision(sqlite_url):
    result = invoke(sqlite_url, "db", "downgrade")
    assert result.exit_code == 2
    assert "REVISION" in result.stderr


@pytest.mark.postgres
def test_a_postgres_database_behind_head_is_refused_with_the_command_to_run(postgres_url):
    previous = revisions()[-2]
    succeeded(invoke(postgres_url, "db", "downgrade", previous, "--yes"))

    for command in (
        ["sessions"],
        ["sessions", "--json"],
        ["entities", "--session", "acme"],
        ["entity", "Sarah", "--session", "acme"],
        ["stats"],
        ["forget", "--yes", "Sarah", "--session", "acme"],
        ["export", "--session", "acme", "-o", "-"],
    ):
        line = one_line_error(invoke(postgres_url, *command))
        assert "zerda-store --database-url " in line and "db upgrade`" in line, command
        assert previous in line

    # refusing did not upgrade it behind the operator's back
    assert schema_objects(postgres_url)[2] == [(previous,)]
    succeeded(invoke(postgres_url, "db", "upgrade"))
    assert json_of(invoke(postgres_url, "sessions", "--json")) == []


def test_a_sqlite_file_behind_head_is_upgraded_by_db_upgrade_only(sqlite_url):
    """Reading commands never migrate, and neither do the commands that change the memory
    (the fourth hardening round, H7): only `db upgrade`, which reports what its upgrade
    changes, does (the Python API's SQLite still upgrades itself on first use)."""
    first = revisions()[0]
    succeeded(invoke(sqlite_url, "db", "upgrade", first))
    line = one_line_error(invoke(sqlite_url, "sessions", "--json"))
    assert "zerda-store --database-url " in line and "db upgrade`" in line
    assert first in line
    assert succeeded(invoke(sqlite_url, "db", "current")).stdout.strip() == (
        f"{first} (head is {HEAD})"
    )

    line = one_line_error(invoke(sqlite_url, "forget", "--yes", "Ada", "--session", "s"))
    assert "db upgrade`" in line
    assert succeeded(invoke(sqlite_url, "db", "current")).stdout.strip() == (
        f"{first} (head is {HEAD})"
    )
    succeeded(invoke(sqlite_url, "db", "upgrade"))
    assert json_of(invoke(sqlite_url, "sessions", "--json")) == []


# -- URLs that cannot work ------------------------------------------------------------------

WRONG_URLS = [
    pytest.param("nosuchdb://x", id="unknown-scheme"),
    pytest.param("not a url", id="not-a-url"),
    pytest.param("mysql://u:secret@127.0.0.1/x", id="unsupported-database"),
]
BAD_URLS = [
    pytest.param("postgresql://u:secret@127.0.0.1:1/x", id="unreachable"),
    pytest.param("postgres://u:secret@127.0.0.1:1/x", id="unreachable-postgres-scheme"),
]
COMMANDS = [
    ["sessions"],
    ["db", "current"],
    ["db", "upgrade"],
    ["entity", "Sarah", "--session", "s"],
    ["stats", "--json"],
    ["export", "--session", "s", "-o", "-"],
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_an_unusable_url_fails_in_one_line_without_the_password(url):
    for command in COMMANDS:
        result = invoke(url, *command)
        one_line_error(result)
        assert "secret" not in result.output, command


@pytest.mark.parametrize("url", WRONG_URLS)
def test_a_url_that_is_no_usable_url_is_a_usage_error_without_the_password(url):
    """Exit codes by one rule: a URL that does not parse or names another database is the
    operator's argument refused (exit 2), not a failure."""
    for command in COMMANDS:
        result = invoke(url, *command)
        line = usage_error(result)
        assert "secret" not in result.output, command
        assert line.count("zerda_store runs on") <= 1, line


def test_an_unreachable_server_is_named_in_the_message():
    line = one_line_error(invoke("postgresql://u:secret@127.0.0.1:1/x", "sessions"))
    assert "cannot connect" in line
    assert "127.0.0.1" in line
    assert "u:***@" in line


def test_a_password_in_the_environment_is_not_printed_either():
    result = CliRunner(
        env={"ZERDA_STORE_DATABASE_URL": "postgresql://admin:hunter2@127.0.0.1:1/x"}
    ).invoke(main, ["db", "current"])
    one_line_error(result)
    assert "hunter2" not in result.output


# -- concurrent deploy jobs ------------------------------------------------------------------

# Imports everything, says it is ready, waits for the starting signal, then runs the command
# with alembic's INFO log on stderr, where alembic names each revision it applies.
_JOB = """
import logging, os, sys, time
go, ready = sys.argv.pop(1), sys.argv.pop(1)
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
from zerda_store.cli import main
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
main()
"""
JOBS = 4


@pytest.mark.postgres
def test_concurrent_upgrades_apply_each_revision_once(postgres_admin, tmp_path: Path):
    url, drop = new_postgres_database(postgres_admin)
    go = tmp_path / "go"
    jobs = []
    try:
        for number in range(JOBS):
            ready = tmp_path / f"ready-{number}"
            jobs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _JOB,
                        str(go),
                        str(ready),
                        "--database-url",
                        url,
                        "db",
                        "upgrade",
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + 60
        while sum(1 for p in tmp_path.glob("ready-*")) < JOBS:
            assert time.monotonic() < deadline, "the jobs did not start"
            assert all(job.poll() is None for job in jobs), "a job ended before the start"
            time.sleep(0.01)
        go.touch()
        outputs = [job.communicate(timeout=120) for job in jobs]

        for job, (stdout, stderr) in zip(jobs, outputs, strict=True):
            assert job.returncode == 0, stderr
            assert "Traceback" not in stderr
            assert "already exists" not in stderr
            assert stdout.strip().splitlines()[-1] == f"database at revision {HEAD}"
        listed = [
            line.split()[1]
            for stdout, _ in outputs
            for line in stdout.splitlines()
            if line.startswith("applied ")
        ]
        assert sorted(listed) == sorted(revisions())  # each job lists what it applied
        applied = [
            match.group(1)
            for _, stderr in outputs
            for match in re.finditer(r"Running upgrade \S* ?-> (\w+)", stderr)
        ]
        assert sorted(applied) == sorted(revisions())

        tables, views, versions = schema_objects(url)
        assert versions == [(HEAD,)]
        assert tables >= TABLES
        assert views >= VIEWS
        assert succeeded(invoke(url, "db", "current")).stdout.strip() == f"{HEAD} (head)"
        assert "schema matches the code" in succeeded(invoke(url, "db", "check")).stdout
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
        drop()


def test_db_current_on_an_empty_database_exits_0_saying_so(empty_database_url):
    """The fourth hardening round: as `alembic current` does, an empty database is at no
    revision, which is no failure (a missing SQLite file still is: nothing is created)."""
    if empty_database_url.startswith("sqlite"):
        Path(empty_database_url.removeprefix("sqlite:///")).touch()

    text = succeeded(invoke(empty_database_url, "db", "current")).stdout
    shown = json_of(invoke(empty_database_url, "db", "current", "--json"))

    assert text.startswith("no revision: an empty database")
    assert (shown["revision"], shown["is_head"]) == (None, False)
