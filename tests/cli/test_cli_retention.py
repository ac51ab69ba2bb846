"""`retention set|show|clear` and `prune [--session S] [--dry-run] [--json]`."""

from __future__ import annotations

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded


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
        "rules deleted"
        in succeeded(invoke(populated, "retention", "clear", "--session", "acme")).stdout
    )
    shown = json_of(invoke(populated, "retention", "show", "--session", "acme", "--json"))
    assert shown["effective"]["source"] == "default"


def test_prune_dry_run_reports_what_prune_then_deletes(populated):
    succeeded(invoke(populated, "retention", "set", "--session", "acme", "--keep-last", "1"))

    planned = json_of(invoke(populated, "prune", "--session", "acme", "--dry-run", "--json"))
    done = json_of(invoke(populated, "prune", "--session", "acme", "--json"))
    again = json_of(invoke(populated, "prune", "--json"))

    assert planned["dry_run"] and not done["dry_run"]
    assert planned["snippets"] > 0
    assert {k: v for k, v in planned.items() if k != "dry_run"} == {
        k: v for k, v in done.items() if k != "dry_run"
    }
    assert again["snippets"] == 0
    assert "deleted:" in succeeded(invoke(populated, "prune")).stdout


def test_retention_needs_exactly_one_scope_and_a_valid_duration(populated):
    assert "--session" in invoke(populated, "retention", "show").output
    error = one_line_error(invoke(populated, "retention", "set", "--default"))
    assert "needs keep_last" in error
    bad = invoke(populated, "retention", "set", "--default", "--max-age", "soon")
    assert bad.exit_code != 0 and "positive duration" in bad.output
