"""The ``retention`` and ``prune`` commands: thin over :class:`AdminRepository`."""

from __future__ import annotations

import json
import re
from typing import Any

import click

from .common import Context, json_option, print_text

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Duration(click.ParamType[float, Any]):
    """A duration: a number of seconds, or a number with s, m, h, d or w (``90d``)."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(value))
        if found is None or float(found.group(1)) <= 0:
            self.fail(f"{value!r} is not a positive duration (e.g. 3600, 12h, 90d)", param, ctx)
        return float(found.group(1)) * _UNITS.get(found.group(2) or "s", 1)


scope_options = [
    click.option("--session", "session_id", help="The session (else --default)."),
    click.option("--default", "default", is_flag=True, help="The default policy."),
]


def _scope(session_id: str | None, default: bool) -> str | None:
    if (session_id is None) == (not default):
        raise click.UsageError("give either --session S or --default")
    return session_id


def _with_scope(command: Any) -> Any:
    for option in reversed(scope_options):
        command = option(command)
    return command


@click.group()
def retention() -> None:
    """Set, show or clear retention policies (per session, or the default)."""


@retention.command("set")
@_with_scope
@click.option("--keep-last", type=click.IntRange(min=1), help="Snippets kept per entity.")
@click.option("--max-age", type=Duration(), help="Drop snippets and turns older (e.g. 90d).")
@click.option("--session-idle", type=Duration(), help="Expire a session idle this long.")
@click.option("--entity-type", help="Apply to entities of this type only.")
@click.pass_obj
def retention_set(
    obj: Context,
    session_id: str | None,
    default: bool,
    keep_last: int | None,
    max_age: float | None,
    session_idle: float | None,
    entity_type: str | None,
) -> None:
    """Set (replace) the rule of a session or of the default."""
    scope = _scope(session_id, default)
    obj.repository().set_retention(scope, keep_last, max_age, session_idle, entity_type=entity_type)
    click.echo(f"retention set for {'the default' if scope is None else repr(scope)}")


@retention.command("show")
@_with_scope
@json_option
@click.pass_obj
def retention_show(obj: Context, session_id: str | None, default: bool, as_json: bool) -> None:
    """Show the rules of a session (and the policy in effect for it) or of the default."""
    shown = obj.repository().retention(_scope(session_id, default))
    if as_json:
        click.echo(json.dumps(shown, ensure_ascii=False, indent=2))
        return
    print_text(f"scope: {shown['scope']}")
    print_text(_rule_line("every type", shown))
    for entity_type, rule in shown["by_type"].items():
        print_text(_rule_line(f"type {entity_type}", rule))
    if "effective" in shown:
        print_text(f"in effect: {shown['effective']['source'] or 'no policy'}")


def _rule_line(label: str, rule: dict[str, Any]) -> str:
    fields = ("keep_last", "max_age", "session_idle")
    return f"  {label}: " + ", ".join(f"{field}={rule[field]}" for field in fields)


@retention.command("clear")
@_with_scope
@click.option("--entity-type", help="Clear only this entity type's rule.")
@click.pass_obj
def retention_clear(
    obj: Context, session_id: str | None, default: bool, entity_type: str | None
) -> None:
    """Delete the rules of a session or of the default."""
    deleted = obj.repository().clear_retention(_scope(session_id, default), entity_type=entity_type)
    click.echo(f"{deleted} rules deleted")


@click.command()
@click.option("--session", "session_id", help="One session (default: every session).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@json_option
@click.pass_obj
def prune(obj: Context, session_id: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete what the retention policies expired, in short batches (safe to rerun)."""
    receipt = obj.repository().prune(session_id, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **receipt}, indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{verb}: {receipt['sessions']} sessions, {receipt['turns']} turns, "
        f"{receipt['snippets']} snippets, {receipt['entities']} entities"
    )
