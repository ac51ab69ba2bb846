"""Exit codes by one rule: 0 ok, 1 failure, 2 usage. An argument the command refuses (a
number or a duration out of range, a session id or a name no session or entity can have,
a revision or an address that is no such thing, options that contradict each other) is a
usage error in click's style, whether click or the library's input rules refuse it, and
nothing is read or changed; what goes wrong with a good argument (not found, a refused
merge, a database that cannot be reached) is a failure."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import invoke, one_line_error, succeeded, usage_error

NUL = "a\x00b"
CONTROL = "a\x01b"
LONG_SESSION = "s" * 256
LONG_NAME = "n" * 257

USAGE_ERRORS = {
    "empty session id": ("entities", "--session", ""),
    "session id too long": ("stats", "--session", LONG_SESSION),
    "session id with NUL": ("entity", "Sarah Chen", "--session", NUL),
    "empty name": ("entity", "", "--session", "acme"),
    "name too long": ("entity", LONG_NAME, "--session", "acme"),
    "name with a control character": ("forget", CONTROL, "--session", "acme", "--yes"),
    "forget in no session": ("forget", "Sarah Chen", "--session", "", "--dry-run"),
    "export of no session": ("export", "--session", "", "-o", "-"),
    "import into no session": ("import", "-", "--session", LONG_SESSION),
    "copy of no session": ("copy", "--to", "sqlite:///never-made.db", "--session", ""),
    "copy to no URL": ("copy", "--to", "not a url"),
    "copy to another database kind": ("copy", "--to", "mysql://localhost/db"),
    "keep-last 0": ("retention", "set", "--default", "--keep-last", "0"),
    "bare duration": ("retention", "set", "--default", "--max-age", "3"),
    "retention of no session": ("retention", "set", "--session", "", "--keep-last", "3"),
    "bad entity type": ("retention", "set", "--default", "--keep-last", "3", "--entity-type", CONTROL),
    "session-idle of one type": (
        "retention", "set", "--default", "--session-idle", "90d", "--entity-type", "PERSON",
    ),
    "session and default": ("retention", "set", "--default", "--session", "acme", "--keep-last", "3"),
    "retention set with no field": ("retention", "set", "--session", "acme"),
    "retention show of no session": ("retention", "show", "--session", NUL),
    "retention clear of no type": ("retention", "clear", "--default", "--entity-type", "", "--yes"),
    "prune of no session": ("prune", "--session", "", "--yes"),
    "alias with a control character": ("alias", "add", "Sarah Chen", CONTROL, "--session", "acme"),
    "remove no alias": ("alias", "remove", "", "--session", "acme"),
    "aliases of no session": ("alias", "list", "--session", ""),
    "merge of no name": ("merge", "Sarah Chen", LONG_NAME, "--session", "acme"),
    "unmerge 0": ("unmerge", "0", "--session", "acme"),
    "merges of no session": ("merges", "--session", ""),
    "judged by a control character": (
        "similar", "confirm", "Sarah Chen", "Acme Corp", "--session", "acme", "--by", CONTROL,
    ),
    "reject no name": ("similar", "reject", "", "Acme Corp", "--session", "acme"),
    "undo no name": ("similar", "undo", "Sarah Chen", NUL, "--session", "acme"),
    "judgements of no session": ("similar", "judgements", "--session", ""),
    "similar limit 0": ("entities", "--session", "acme", "--similar", "--limit", "0"),
    "reextract of no session": ("reextract", "--failed", "--session", ""),
    "upgrade to no revision": ("db", "upgrade", "9999"),
    "assume no session normalized": ("db", "upgrade", "--assume-normalized", ""),
    "downgrade to no revision": ("db", "downgrade", "nonsense", "--dry-run"),
    "rekey no session": ("db", "rekey", "--assume-normalized", NUL),
    "drain no address": ("db", "citus", "drain", "host:port"),
    "add no address": ("db", "citus", "add-worker", ":5432"),
    "no schema name": ("--schema", "Not-A-Schema", "sessions"),
}  # fmt: skip

FAILURES = {
    "no such session": ("stats", "--session", "nosuch"),
    "no such entity": ("entity", "Nobody", "--session", "acme"),
    "forget no such entity": ("forget", "Nobody", "--session", "acme", "--yes"),
    "no such merge": ("unmerge", "99", "--session", "acme"),
    "a refused merge": ("merge", "Sarah Chen", "SARAH CHEN", "--session", "acme"),
    "no such alias": ("alias", "remove", "Nobody", "--session", "acme"),
    "no such file": ("import", "no-such-export.jsonl", "--session", "new"),
}


def _stored(url: str) -> tuple[object, object]:
    """What the database holds, as the commands list it."""
    sessions = json.loads(succeeded(invoke(url, "sessions", "--include-expired", "--json")).stdout)
    default = json.loads(succeeded(invoke(url, "retention", "show", "--default", "--json")).stdout)
    return sessions, default


@pytest.mark.fans_out
@pytest.mark.parametrize("args", list(USAGE_ERRORS.values()), ids=list(USAGE_ERRORS))
def test_a_refused_argument_is_a_usage_error_that_changes_nothing(shared_populated, args):
    before = _stored(shared_populated)

    error = usage_error(invoke(shared_populated, *args))

    assert "Traceback" not in error
    assert _stored(shared_populated) == before


@pytest.mark.fans_out
@pytest.mark.parametrize("args", list(FAILURES.values()), ids=list(FAILURES))
def test_a_failure_with_good_arguments_exits_1(shared_populated, args):
    before = _stored(shared_populated)

    one_line_error(invoke(shared_populated, *args))
    assert invoke(shared_populated, *args).exit_code == 1

    assert _stored(shared_populated) == before


def test_a_database_that_cannot_be_reached_is_a_failure():
    result = invoke("postgresql://nobody@127.0.0.1:9/nothing?connect_timeout=2", "sessions")

    assert result.exit_code == 1
    assert "Usage:" not in result.stderr


def test_a_refusal_names_the_option_it_refuses(shared_populated):
    error = usage_error(invoke(shared_populated, "entity", "Sarah Chen", "--session", ""))

    assert error == (
        "Error: Invalid value for '--session': a session id must be 1 to 255 characters long"
    )


@pytest.mark.postgres
def test_db_grant_without_a_role_is_a_usage_error(postgres_url):
    result = invoke(postgres_url, "db", "grant", "--dry-run")

    assert "name a role to grant to" in usage_error(result)


def test_a_name_with_a_variation_selector_finds_the_entity(shared_populated):
    """H12 on the command line: a name is cleaned as extraction cleans it."""
    shown = json.loads(
        succeeded(
            invoke(shared_populated, "entity", "Sarah Chen\ufe0f", "--session", "acme", "--json")
        ).stdout
    )

    assert shown["name"] == "Sarah Chen"
