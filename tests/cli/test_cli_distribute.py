"""`db distribute [--dry-run]`: refused in one line on SQLite, on Postgres without the
citus extension, on a schema behind head and while a Citus rule is broken; the statements
it runs, checked on Postgres with stand-ins for Citus's functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded
from tests.doubles import new_postgres_database
from zerda_store import Store, migrate
from zerda_store.db.citus import distribution
from zerda_store.db.citus.distribution import UNIQUE, Violation

PLAN = [
    "SELECT create_reference_table('retention_policies')",
    "SELECT create_reference_table('compatibility_floor')",
    "SELECT create_distributed_table('turns', 'session_id')",
    "SELECT create_distributed_table('entities', 'session_id', colocate_with => 'turns')",
    "SELECT create_distributed_table('contexts', 'session_id', colocate_with => 'turns')",
    "SELECT create_distributed_table('extractions', 'session_id', colocate_with => 'turns')",
    "SELECT create_distributed_table('entity_aliases', 'session_id', colocate_with => 'turns')",
    "SELECT create_distributed_table('entity_merges', 'session_id', colocate_with => 'turns')",
    "SELECT create_distributed_table('session_key_rules', 'session_id', colocate_with => 'turns')",
    "SELECT create_distributed_table('identity_judgements', 'session_id', colocate_with => 'turns')",
]

# Citus's functions, as stand-ins that record their calls.
STAND_INS = """
CREATE TABLE citus_calls (n serial PRIMARY KEY, call text NOT NULL);
CREATE FUNCTION create_reference_table(t regclass) RETURNS void LANGUAGE sql
  AS $$ INSERT INTO citus_calls (call) VALUES ('reference ' || t::text) $$;
CREATE FUNCTION create_distributed_table(t regclass, c text, colocate_with text DEFAULT '')
  RETURNS void LANGUAGE sql
  AS $$ INSERT INTO citus_calls (call) VALUES ('distributed ' || t::text || ' ' || c || ' '
        || colocate_with) $$;
CREATE FUNCTION create_distributed_function(
    f regprocedure, arg text, colocate_with text, force_delegation boolean
  ) RETURNS void LANGUAGE sql
  AS $$ INSERT INTO citus_calls (call) VALUES ('function ' || f::regproc::text || ' ' || arg
        || ' ' || colocate_with || ' ' || force_delegation::text) $$;
"""
# What the functions' statements print in a dry run, and the calls they make.
FUNCTION_LINES = [
    f"-- CREATE OR REPLACE FUNCTION public.{name}( ..."
    for name in (
        "zerda_shard_lock_v1",
        "zerda_save_turn_v1",
        "zerda_recall_v1",
        "zerda_session_lock_v1",
    )
]
FUNCTION_CALLS = [
    "function zerda_shard_lock_v1 p_session_id turns false",
    "function zerda_save_turn_v1 p_session_id turns false",
    "function zerda_recall_v1 p_session_id turns false",
    "function zerda_session_lock_v1 p_session_id turns true",
]


def test_the_plan_references_the_policies_then_distributes_parents_first() -> None:
    assert distribution.statements() == PLAN


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_sqlite_database_is_refused_in_one_line(sqlite_url: str, dry_run: list[str]) -> None:
    with Store(sqlite_url) as store:
        migrate.upgrade(store)
    line = one_line_error(invoke(sqlite_url, "db", "distribute", *dry_run))
    assert "SQLite database cannot be distributed" in line


def test_a_sqlite_file_that_is_not_there_is_not_created(tmp_path: Path) -> None:
    line = one_line_error(invoke(f"sqlite:///{tmp_path / 'none.db'}", "db", "distribute"))
    assert "cannot be distributed" in line
    assert not (tmp_path / "none.db").exists()


@pytest.mark.postgres
def test_postgres_without_citus_is_refused_in_one_line_and_left_as_it_was(
    postgres_url: str,
) -> None:
    line = one_line_error(invoke(postgres_url, "db", "distribute"))
    assert "the citus extension is not installed" in line
    assert "CREATE EXTENSION citus" in line
    with Store(postgres_url) as store:
        assert migrate.current_revision(store) == migrate.head_revision()


@pytest.mark.postgres
def test_the_dry_run_prints_the_statements_and_every_blocker(postgres_url: str) -> None:
    result = invoke(postgres_url, "db", "distribute", "--dry-run")
    assert result.exit_code == 1  # blocked: a deploy script's dry run fails
    assert result.stderr == "Error: db distribute is blocked (1 blocker above)\n"
    lines = result.stdout.splitlines()
    assert lines[: len(PLAN)] == [f"{statement};" for statement in PLAN]
    blockers = lines[len(PLAN) :]
    assert len(blockers) == 1  # the schema follows every rule: only Citus is missing
    assert blockers[0].startswith("-- blocked: the citus extension is not installed")


@pytest.mark.postgres
def test_the_dry_run_in_json_lists_the_statements_and_blockers_and_exits_1(
    postgres_url: str,
) -> None:
    result = invoke(postgres_url, "db", "distribute", "--dry-run", "--json")
    assert result.exit_code == 1
    assert result.stderr == "Error: db distribute is blocked (1 blocker in blockers)\n"
    answer = json.loads(result.stdout)
    assert answer["statements"] == PLAN
    assert (answer["dry_run"], answer["ran"], answer["already_distributed"]) == (True, False, [])
    assert [b.split(" in ")[0] for b in answer["blockers"]] == [
        "the citus extension is not installed"
    ]


@pytest.mark.postgres
def test_a_schema_behind_head_is_refused_with_the_command_to_run(
    postgres_admin: sa.Engine,
) -> None:
    url, drop = new_postgres_database(postgres_admin)
    try:
        with Store(url) as store:
            migrate.upgrade(store, "0004")
        line = one_line_error(invoke(url, "db", "distribute"))
        assert "zerda-store --database-url " in line and "db upgrade`" in line
    finally:
        drop()


@pytest.mark.postgres
def test_with_citus_a_broken_rule_is_refused_and_nothing_runs(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distribution, "citus_version", lambda connection: "12.1")
    _install_stand_ins(postgres_url)
    with Store(postgres_url) as store, store.connect() as connection, connection.begin():
        connection.exec_driver_sql("ALTER TABLE entities ADD CONSTRAINT uq_bad UNIQUE (name_key)")
        connection.exec_driver_sql("ALTER TABLE turns ADD CONSTRAINT uq_worse UNIQUE (input_text)")
    line = one_line_error(invoke(postgres_url, "db", "distribute"))
    assert f"cannot distribute: {Violation('entities', 'uq_bad', UNIQUE)}" in line
    assert "and 1 more" in line
    assert _calls(postgres_url) == []


@pytest.mark.postgres
def test_with_citus_and_the_rules_followed_it_runs_the_plan_in_order(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distribution, "citus_version", lambda connection: "12.1")
    _install_stand_ins(postgres_url)
    output = succeeded(invoke(postgres_url, "db", "distribute")).stdout
    assert "tables distributed by session_id" in output
    assert _calls(postgres_url) == [
        "reference retention_policies",
        "reference compatibility_floor",
        "distributed turns session_id ",
        "distributed entities session_id turns",
        "distributed contexts session_id turns",
        "distributed extractions session_id turns",
        "distributed entity_aliases session_id turns",
        "distributed entity_merges session_id turns",
        "distributed session_key_rules session_id turns",
        "distributed identity_judgements session_id turns",
        *FUNCTION_CALLS,
    ]


def _install_stand_ins(url: str) -> None:
    with Store(url) as store, store.connect() as connection, connection.begin():
        connection.exec_driver_sql(STAND_INS)


def _calls(url: str) -> list[str]:
    with Store(url) as store, store.connect() as connection:
        return list(connection.exec_driver_sql("SELECT call FROM citus_calls ORDER BY n").scalars())


@pytest.mark.postgres
def test_with_citus_and_the_rules_followed_the_dry_run_exits_0_and_runs_nothing(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distribution, "citus_version", lambda connection: "12.1")
    _install_stand_ins(postgres_url)

    lines = succeeded(invoke(postgres_url, "db", "distribute", "--dry-run")).stdout.splitlines()

    assert lines[: len(PLAN) + 4] == [f"{statement};" for statement in PLAN] + FUNCTION_LINES
    assert [line.split("(", 1)[0] for line in lines[len(PLAN) + 4 :]] == [
        "SELECT create_distributed_function"
    ] * 4
    assert _calls(postgres_url) == []


@pytest.mark.postgres
def test_with_citus_the_run_in_json_says_what_ran(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distribution, "citus_version", lambda connection: "12.1")
    _install_stand_ins(postgres_url)

    answer = json_of(invoke(postgres_url, "db", "distribute", "--json"))

    assert answer == {
        "dry_run": False,
        "ran": True,
        "statements": PLAN,
        "already_distributed": [],
        "functions": [
            "public.zerda_shard_lock_v1",
            "public.zerda_save_turn_v1",
            "public.zerda_recall_v1",
            "public.zerda_session_lock_v1",
        ],
        "blockers": [],
    }
    assert _calls(postgres_url)[len(PLAN) :] == FUNCTION_CALLS
