"""What `db upgrade` says about the data it changed: per session, each merge the new key
rules made with the command that undoes it (text and --json), the sessions kept exact for
want of evidence; and what `db downgrade` says when it cannot give the older version its
data back."""

from __future__ import annotations

import shlex

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded
from tests.doubles import FixedLLM
from tests.migrations.released import RELEASED_REVISION, released_database, save_turns
from zerda_store import ConversationEntityMemory, Store, migrate


def _released(url: str) -> None:
    with Store(url) as store:
        released_database(store)
        save_turns(store, "crm", [["Sarah", "Müller"], ["Muller"]])
        save_turns(store, "exact", [["muller"], ["müller"]], exact=True)


def test_db_upgrade_prints_each_merge_with_the_command_that_undoes_it(empty_database_url):
    _released(empty_database_url)

    printed = succeeded(invoke(empty_database_url, "db", "upgrade")).stdout.splitlines()
    applied = [line for line in printed if line.startswith("applied ")]
    assert applied[0] == "applied 0005 (retention)"  # each revision applied, oldest first
    assert applied[-1].startswith(f"applied {migrate.head_revision()} ")
    lines = printed[len(applied) :]

    undo = "zerda-store unmerge 1 --session crm"
    assert lines[0] == (
        f"session 'crm': merged 'Muller' into 'Müller' (merge 1, one key under fold-v2); "
        f"undo with: {undo}"
    )
    assert lines[1].startswith("session 'exact': kept its keys as written (exact)")
    assert lines[1].endswith("`zerda-store db upgrade --assume-normalized exact`")
    assert lines[-2] == (
        "2 sessions recorded: 1 re-keyed, 1 merge (`zerda-store merges --session S` lists them)"
    )  # counts and nouns agree
    assert lines[-1] == f"database at revision {migrate.head_revision()}"
    undone = succeeded(invoke(empty_database_url, *shlex.split(undo)[1:]))
    assert "'Müller' and 'Muller' are two entities again" in undone.stdout


def test_db_upgrade_json_lists_the_sessions_and_their_merges(empty_database_url):
    _released(empty_database_url)

    report = json_of(invoke(empty_database_url, "db", "upgrade", "--json"))

    assert report["revision"] == migrate.head_revision()
    assert report["applied"][0] == "0005" and report["applied"][-1] == migrate.head_revision()
    crm, exact = report["sessions"]
    assert (crm["session_id"], crm["key_rules"], crm["unsure"]) == ("crm", "fold-v2", False)
    assert crm["merges"] == [
        {
            "merge_id": 1,
            "kept": "Müller",
            "merged": "Muller",
            "undone": False,
            "undo": "zerda-store unmerge 1 --session crm",
        }
    ]
    assert (exact["key_rules"], exact["unsure"], exact["merges"]) == ("exact", True, [])


def test_db_downgrade_the_older_version_could_not_read_is_one_line_saying_what_to_do(
    empty_database_url,
):
    _released(empty_database_url)
    succeeded(invoke(empty_database_url, "db", "upgrade"))
    with Store(empty_database_url) as store:
        for name in ("Bill", "bill"):
            llm = FixedLLM(name)
            with ConversationEntityMemory.for_session(store, "crm", llm=llm) as memory:
                memory.save_context({"input": name}, {"output": "ok"})

    error = one_line_error(
        invoke(empty_database_url, "db", "downgrade", RELEASED_REVISION, "--yes")
    )

    assert "cannot tell 'Bill' and 'bill' of session 'crm' apart" in error
    assert "merge or forget one" in error


def test_db_upgrade_rekeys_the_unsure_sessions_it_is_told_were_normalised(empty_database_url):
    _released(empty_database_url)

    report = json_of(
        invoke(empty_database_url, "db", "upgrade", "--assume-normalized", "exact", "--json")
    )

    assert [m["merged"] for entry in report["sessions"] for m in entry["merges"]] == [
        "Muller",
        "müller",
    ]


# -- the fourth hardening round, H8: --assume-normalized is never silently ignored -------------


def _usage_error(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    return result.stderr.strip().splitlines()[-1]


def test_assume_normalized_at_head_is_refused(empty_database_url):
    _released(empty_database_url)
    succeeded(invoke(empty_database_url, "db", "upgrade"))

    for flag in (["--assume-normalized", "exact"], ["--assume-all-normalized"]):
        line = _usage_error(invoke(empty_database_url, "db", "upgrade", *flag))
        assert "it would change nothing" in line and "db rekey" in line


def test_assume_normalized_for_a_misspelt_session_is_refused_and_nothing_upgraded(
    empty_database_url,
):
    _released(empty_database_url)

    line = _usage_error(invoke(empty_database_url, "db", "upgrade", "--assume-normalized", "exatc"))

    assert "names no session of this database: exatc" in line
    with Store(empty_database_url) as store:
        assert migrate.current_revision(store) == RELEASED_REVISION


def test_rekey_assuming_a_recorded_session_is_refused(empty_database_url):
    _released(empty_database_url)
    succeeded(invoke(empty_database_url, "db", "upgrade"))

    for session_id, why in (("crm", "recorded already (fold-v2)"), ("nobody", "misspelt")):
        line = _usage_error(
            invoke(empty_database_url, "db", "rekey", "--assume-normalized", session_id)
        )
        assert why in line


def test_db_upgrade_at_head_says_nothing_was_applied(empty_database_url):
    _released(empty_database_url)
    succeeded(invoke(empty_database_url, "db", "upgrade"))

    again = succeeded(invoke(empty_database_url, "db", "upgrade")).stdout.splitlines()

    assert again == [
        "nothing to apply: the database was at that revision already",
        f"database at revision {migrate.head_revision()}",
    ]
    assert json_of(invoke(empty_database_url, "db", "upgrade", "--json"))["applied"] == []
