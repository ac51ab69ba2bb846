"""`retention set|show|clear` and `prune [--session S] [--dry-run] [--json]`."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded, usage_error


def test_a_session_policy_is_set_shown_and_cleared(populated):
    succeeded(invoke(populated, "retention", "set", "--session", "acme", "--keep-last", "1"))
    succeeded(
        invoke(populated, "retention", "set", "--default", "--max-age", "90d", "--keep-last", "5")
    )

    shown = json_of(invoke(populated, "retention", "show", "--session", "acme", "--json"))
    default = json_of(invoke(populated, "retention", "show", "--default", "--json"))

    assert (shown["keep_last"], shown["effective"]["source"]) == (1, "session")
    assert (default["keep_last"], default["max_age"]) == (5, 90 * 86400.0)
    assert (
        succeeded(invoke(populated, "retention", "clear", "--yes", "--session", "acme")).stdout
        == "1 rule deleted\n"
    )
    shown = json_of(invoke(populated, "retention", "show", "--session", "acme", "--json"))
    assert shown["effective"]["source"] == "default"


def test_prune_dry_run_reports_what_prune_then_deletes(populated):
    succeeded(invoke(populated, "retention", "set", "--session", "acme", "--keep-last", "1"))

    planned = json_of(invoke(populated, "prune", "--session", "acme", "--dry-run", "--json"))
    done = json_of(invoke(populated, "prune", "--yes", "--session", "acme", "--json"))
    again = json_of(invoke(populated, "prune", "--yes", "--json"))

    assert planned["dry_run"] and not done["dry_run"]
    assert planned["snippets"] > 0
    assert {k: v for k, v in planned.items() if k != "dry_run"} == {
        k: v for k, v in done.items() if k != "dry_run"
    }
    assert again["snippets"] == 0
    assert "deleted:" in succeeded(invoke(populated, "prune", "--yes")).stdout


def test_retention_needs_exactly_one_scope_and_a_valid_duration(populated):
    assert "--session" in invoke(populated, "retention", "show").output
    empty = invoke(populated, "retention", "set", "--default")
    assert empty.exit_code == 2 and "give --keep-last, --max-age or --session-idle" in empty.output
    bad = invoke(populated, "retention", "set", "--default", "--max-age", "soon")
    assert bad.exit_code != 0 and "is not a duration" in bad.output


def test_a_duration_without_a_unit_is_refused_with_the_accepted_forms(populated):
    for bare in ("3", "90", "1.5h", "0d", "-1d"):
        refused = invoke(populated, "retention", "set", "--default", "--max-age", bare)
        assert refused.exit_code == 2, bare
        assert "45s, 30m, 12h or 90d" in refused.output, bare
    assert json_of(invoke(populated, "retention", "show", "--default", "--json"))["max_age"] is None


def test_durations_are_shown_as_written(populated):
    succeeded(
        invoke(
            populated, "retention", "set", "--default", "--max-age", "90d", "--session-idle", "36h"
        )
    )
    succeeded(invoke(populated, "retention", "set", "--session", "acme", "--max-age", "45s"))

    default = succeeded(invoke(populated, "retention", "show", "--default")).stdout
    acme = succeeded(invoke(populated, "retention", "show", "--session", "acme")).stdout

    assert "max_age=90d, session_idle=36h" in default
    assert "7776000" not in default
    assert "max_age=45s" in acme
    shown = json_of(invoke(populated, "retention", "show", "--default", "--json"))
    assert (shown["max_age"], shown["session_idle"]) == (90 * 86400.0, 36 * 3600.0)


def test_setting_one_field_keeps_the_others_unless_replace(populated):
    succeeded(invoke(populated, "retention", "set", "--session", "acme", "--keep-last", "3"))

    merged = json_of(
        invoke(populated, "retention", "set", "--session", "acme", "--max-age", "30m", "--json")
    )
    replaced = json_of(
        invoke(
            populated,
            "retention",
            "set",
            "--session",
            "acme",
            "--max-age",
            "12h",
            "--replace",
            "--json",
        )
    )

    assert merged == {
        "scope": "acme",
        "entity_type": None,
        "keep_last": 3,
        "max_age": 1800.0,
        "session_idle": None,
    }
    assert (replaced["keep_last"], replaced["max_age"]) == (None, 43200.0)
    shown = json_of(invoke(populated, "retention", "show", "--session", "acme", "--json"))
    assert (shown["keep_last"], shown["max_age"]) == (None, 43200.0)


def test_retention_set_and_clear_print_a_receipt(populated):
    said = succeeded(
        invoke(populated, "retention", "set", "--session", "acme", "--keep-last", "2")
    ).stdout
    cleared = json_of(
        invoke(populated, "retention", "clear", "--yes", "--session", "acme", "--json")
    )
    again = succeeded(invoke(populated, "retention", "clear", "--yes", "--session", "acme")).stdout

    assert said.strip() == "retention set for acme: keep_last=2, max_age=-, session_idle=-"
    assert cleared == {"scope": "acme", "entity_type": None, "dry_run": False, "deleted": 1}
    assert again.strip() == "0 rules deleted"


@pytest.mark.parametrize(
    "empty_database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_retention_on_an_empty_postgres_database_creates_no_schema(empty_database_url):
    line = one_line_error(invoke(empty_database_url, "retention", "show", "--default"))

    assert "is not a zerda_store database (it is empty)" in line
    assert "db upgrade`" in line
    engine = sa.create_engine(empty_database_url)
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_numbers_and_types_outside_the_rules_are_usage_errors_and_change_nothing(populated):
    for args in (
        ("--keep-last", "99999999999999999999"),
        ("--keep-last", str(2**31)),
        ("--max-age", "9" * 400 + "d"),
        ("--keep-last", "2", "--entity-type", "x" * 65),
        ("--keep-last", "2", "--entity-type", ""),
        ("--keep-last", "2", "--entity-type", "PER\x1bSON"),
    ):
        usage_error(invoke(populated, "retention", "set", "--session", "acme", *args))
    shown = json_of(invoke(populated, "retention", "show", "--session", "acme", "--json"))
    assert (shown["keep_last"], shown["by_type"]) == (None, {})
    args = ("--keep-last", "2", "--entity-type", "x" * 65)
    assert "'--entity-type': an entity type must be 1 to 64 characters" in usage_error(
        invoke(populated, "retention", "set", "--session", "acme", *args)
    )


def test_retention_set_with_no_field_is_a_usage_error(populated):
    """The fourth hardening round: exit codes by one rule (0 ok, 1 failure, 2 usage);
    `retention set` with no field exited 1."""
    result = invoke(populated, "retention", "set", "--session", "acme")

    assert result.exit_code == 2
    assert "give --keep-last, --max-age or --session-idle" in result.stderr
