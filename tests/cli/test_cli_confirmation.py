"""Every destructive command asks alike (the fourth hardening round): `forget` (with or
without --with-turns), `retention clear`, `prune` and `db downgrade` take --dry-run, which
only says what would go, and --yes; without --yes, where there is no terminal to ask on,
they are refused, saying what they would delete, and nothing changes."""

from __future__ import annotations

import pytest

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded
from zerda_store import migrate


def _kept_two(populated: str) -> str:
    succeeded(invoke(populated, "retention", "set", "--session", "acme", "--keep-last", "1"))
    return populated


def _stats(url: str) -> str:
    """Everything the session stores (what retention hides too), and its policy."""
    stored = succeeded(invoke(url, "export", "--session", "acme", "--include-expired", "-o", "-"))
    policy = succeeded(invoke(url, "retention", "show", "--session", "acme", "--json"))
    return stored.stdout + policy.stdout


DESTRUCTIVE = {
    "forget": (
        ("forget", "Sarah Chen", "--session", "acme"),
        "forget 'Sarah Chen' in session 'acme': 1 entity, 3 snippets, 0 turns deleted",
    ),
    "forget --with-turns": (
        ("forget", "Sarah Chen", "--session", "acme", "--with-turns"),
        "forget 'Sarah Chen' in session 'acme': 2 entities, 5 snippets, 3 turns deleted",
    ),
    "retention clear": (
        ("retention", "clear", "--session", "acme"),
        "retention clear deletes 1 rule of acme (every type)",
    ),
    "prune": (("prune", "--session", "acme"), "prune deletes 0 sessions, 0 turns, 5 snippets"),
}


@pytest.mark.parametrize("command", list(DESTRUCTIVE), ids=list(DESTRUCTIVE))
def test_a_destructive_command_without_yes_off_a_terminal_says_what_and_changes_nothing(
    populated, command
):
    args, what = DESTRUCTIVE[command]
    url = _kept_two(populated)
    before = _stats(url)

    line = one_line_error(invoke(url, *args))

    assert what in line and "pass --yes" in line and "nothing was changed" in line
    assert _stats(url) == before


@pytest.mark.parametrize("command", list(DESTRUCTIVE), ids=list(DESTRUCTIVE))
def test_a_destructive_command_dry_run_changes_nothing_and_yes_goes_ahead(populated, command):
    args, _ = DESTRUCTIVE[command]
    url = _kept_two(populated)
    before = _stats(url)

    succeeded(invoke(url, *args, "--dry-run"))
    assert _stats(url) == before
    succeeded(invoke(url, *args, "--yes"))
    assert _stats(url) != before


def test_db_downgrade_dry_run_says_what_it_drops_and_drops_nothing(populated):
    result = json_of(invoke(populated, "db", "downgrade", "0009", "--dry-run", "--json"))

    undone = result["undone"]
    assert result["dry_run"] is True and undone[0] == migrate.head_revision()
    assert undone[-2:] == ["0011", "0010"] and undone == sorted(undone, reverse=True)
    assert "(head)" in succeeded(invoke(populated, "db", "current")).stdout
