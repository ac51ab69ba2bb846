"""Retention policies travel with the data (the fourth hardening round, H3): `copy` and
`export`/`import` carry the session's own rules and the default's, and say so, so that
what expired at the source stays expired at the destination, `--include-expired` or not."""

from __future__ import annotations

from tests.cli.helpers import invoke, json_of, succeeded
from tests.cli.test_cli_expired import DAY, aged, kept_two  # noqa: F401 (fixtures)


def _names(url: str, session_id: str) -> list[str]:
    return [e["name"] for e in json_of(invoke(url, "entities", "--session", session_id, "--json"))]


def _rule(url: str, *scope: str) -> dict:
    shown = json_of(invoke(url, "retention", "show", *scope, "--json"))
    return {k: shown[k] for k in ("keep_last", "max_age", "session_idle")}


def test_copy_carries_the_default_and_the_sessions_policies(aged, tmp_path):
    succeeded(invoke(aged, "retention", "set", "--default", "--keep-last", "5"))
    target = f"sqlite:///{tmp_path / 'copy.db'}"

    result = succeeded(invoke(aged, "copy", "--to", target, "--include-expired"))

    assert "retention rules carried: 1 of the default, 1 of sessions" in result.stdout
    assert _rule(target, "--default") == {"keep_last": 5, "max_age": None, "session_idle": None}
    assert _rule(target, "--session", "a") == {
        "keep_last": None,
        "max_age": DAY,
        "session_idle": None,
    }
    assert _names(target, "a") == ["New"]  # what expired at the source is hidden here too


def test_export_and_import_carry_the_sessions_policy(aged, tmp_path):
    path = tmp_path / "a.jsonl"
    exported = succeeded(
        invoke(aged, "export", "--session", "a", "--include-expired", "-o", str(path))
    )
    assert "1 retention rule carried" in exported.stderr
    target = f"sqlite:///{tmp_path / 'target.db'}"

    result = succeeded(invoke(target, "import", str(path), "--session", "a"))

    assert "its retention policy carried (1 rule)" in result.stdout
    assert _rule(target, "--session", "a")["max_age"] == DAY
    assert _names(target, "a") == ["New"]


def test_an_import_keeps_the_sources_default_as_the_sessions_own_policy(kept_two, tmp_path):
    succeeded(invoke(kept_two, "retention", "clear", "--session", "k"))
    succeeded(invoke(kept_two, "retention", "set", "--default", "--keep-last", "2"))
    path = tmp_path / "k.jsonl"
    succeeded(invoke(kept_two, "export", "--session", "k", "--include-expired", "-o", str(path)))
    target = f"sqlite:///{tmp_path / 'target.db'}"

    receipt = json_of(invoke(target, "import", str(path), "--session", "k", "--json"))

    assert (receipt["retention"], receipt["retention_rules"]) == ("default", 1)
    assert _rule(target, "--session", "k")["keep_last"] == 2
    entities = json_of(invoke(target, "entities", "--session", "k", "--json"))
    assert [e["contexts_count"] for e in entities] == [2, 2]
