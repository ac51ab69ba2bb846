"""`db downgrade` asks before it drops anything: with no terminal to ask on it needs --yes;
on a terminal it names what will be dropped and does nothing unless told yes. `db current`
and `db check` report in JSON too, and `db check` on a schema behind head names the command
that upgrades it (SQLite and Postgres)."""

from __future__ import annotations

import pytest

from tests import citus
from tests.cli.helpers import invoke, json_of, one_line_error, succeeded
from tests.cli.test_cli_db import HEAD, TABLES, schema_objects
from zerda_store.cli import schema


def test_downgrade_without_a_terminal_needs_yes_and_names_what_it_drops(database_url):
    line = one_line_error(invoke(database_url, "db", "downgrade", "base"))

    assert "drops every zerda_store table and all their rows" in line
    assert "0006 entity identity; 0005 retention" in line
    assert "pass --yes" in line
    assert schema_objects(database_url)[0] >= TABLES
    assert succeeded(invoke(database_url, "db", "current")).stdout.strip() == f"{HEAD} (head)"


def test_downgrade_with_yes_goes_ahead_and_reports_in_json(database_url):
    report = json_of(invoke(database_url, "db", "downgrade", "--yes", "--json", "--", "-1"))

    assert report["undone"] == [HEAD]
    assert report["revision"] != HEAD
    assert not json_of(invoke(database_url, "db", "current", "--json"))["is_head"]


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setattr(schema, "on_terminal", lambda: True)


def test_downgrade_on_a_terminal_asks_and_a_no_changes_nothing(database_url, terminal):
    refused = invoke(database_url, "db", "downgrade", "base", input="n\n")

    assert refused.exit_code == 1
    assert "drops every zerda_store table" in refused.stdout
    assert "Downgrade? [y/N]" in refused.stdout
    assert "nothing was changed" in refused.stderr
    assert schema_objects(database_url)[0] >= TABLES


@pytest.mark.not_distributed
def test_downgrade_on_a_terminal_goes_ahead_when_told_yes(database_url, terminal):
    done = succeeded(invoke(database_url, "db", "downgrade", "base", input="y\n"))

    assert done.stdout.strip().endswith("database at revision base")
    assert not schema_objects(database_url)[0] & TABLES


def test_a_downgrade_to_the_current_revision_asks_nothing(database_url):
    done = succeeded(invoke(database_url, "db", "downgrade", HEAD))

    assert done.stdout.strip() == f"database at revision {HEAD}"


def test_db_current_and_check_report_in_json(database_url):
    assert json_of(invoke(database_url, "db", "current", "--json")) == {
        "revision": HEAD,
        "head": HEAD,
        "is_head": True,
    }
    assert json_of(invoke(database_url, "db", "check", "--json")) == {
        "revision": HEAD,
        "matches": True,
    }


# On Citus the old schema is the lowest a distributed database can go down to.
OLD = citus.LOWEST_REVISION if citus.CITUS_URL else "0003"


def test_db_check_on_a_schema_behind_head_names_the_command_to_run(database_url):
    succeeded(invoke(database_url, "db", "downgrade", OLD, "--yes"))

    line = one_line_error(invoke(database_url, "db", "check"))

    assert "not up to date" in line and OLD in line
    assert "zerda-store --database-url " in line and "db upgrade`" in line
