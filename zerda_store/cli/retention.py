"""The ``retention`` and ``prune`` commands: thin over :class:`AdminRepository`."""

from __future__ import annotations

import json
import re
from typing import Any

import click

from .common import (
    ENTITY_TYPE,
    MAX_COUNT,
    MAX_SECONDS,
    SESSION_ID,
    Context,
    dry_run_option,
    go_ahead,
    json_option,
    plural,
    print_text,
    yes_option,
)

# The units a duration is written in on the command line, largest first.
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_FORMS = "a whole number with a unit: 45s, 30m, 12h or 90d"


class Duration(click.ParamType[float, Any]):
    """A duration with its unit (``45s``, ``30m``, ``12h``, ``90d``), as seconds. A bare
    number is refused: ``--max-age 3`` meaning three seconds surprised operators."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        found = re.fullmatch(r"\s*(\d+)\s*([dhms])\s*", str(value))
        if found is None or int(found.group(1)) == 0:
            self.fail(f"{value!r} is not a duration: give {_FORMS}", param, ctx)
        seconds = int(found.group(1)) * _UNITS[found.group(2)]
        if seconds > MAX_SECONDS:  # (an int of any size; a float of it would overflow)
            self.fail(f"{value!r} is longer than {written(MAX_SECONDS)}", param, ctx)
        return float(seconds)


def written(seconds: float | None) -> str:
    """A duration as an operator writes it: the largest unit that divides it (``90d``,
    ``36h``), or ``-`` for none."""
    if seconds is None:
        return "-"
    for unit, size in _UNITS.items():
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


scope_options = [
    click.option("--session", "session_id", type=SESSION_ID, help="The session (else --default)."),
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
@click.option("--keep-last", type=click.IntRange(1, MAX_COUNT), help="Snippets kept per entity.")
@click.option(
    "--max-age", type=Duration(), help=f"Drop snippets and turns older than this ({_FORMS})."
)
@click.option("--session-idle", type=Duration(), help="Expire a session idle this long (90d).")
@click.option("--entity-type", type=ENTITY_TYPE, help="Apply to entities of this type only.")
@click.option(
    "--replace",
    is_flag=True,
    help="Replace the stored rule whole (fields not given are unset). Without it, the "
    "fields not given keep their stored values.",
)
@json_option
@click.pass_obj
def retention_set(
    obj: Context,
    session_id: str | None,
    default: bool,
    keep_last: int | None,
    max_age: float | None,
    session_idle: float | None,
    entity_type: str | None,
    replace: bool,
    as_json: bool,
) -> None:
    """Set the rule of a session or of the default: the fields given change, the others
    keep their stored values (unless --replace)."""
    scope = _scope(session_id, default)
    if keep_last is None and max_age is None and session_idle is None:
        raise click.UsageError("give --keep-last, --max-age or --session-idle (or several)")
    stored = obj.repository().set_retention(
        scope, keep_last, max_age, session_idle, entity_type=entity_type, merge=not replace
    )
    receipt = {"scope": _scope_name(scope), "entity_type": entity_type, **stored}
    if as_json:
        click.echo(json.dumps(receipt, ensure_ascii=False, indent=2))
        return
    print_text(_rule_line(f"retention set for {receipt['scope']}", stored, entity_type).strip())


def _scope_name(scope: str | None) -> str:
    return "default" if scope is None else scope


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


def _rule_line(label: str, rule: dict[str, Any], entity_type: str | None = None) -> str:
    kind = f" (type {entity_type})" if entity_type else ""
    return (
        f"  {label}{kind}: keep_last={rule['keep_last'] or '-'}, "
        f"max_age={written(rule['max_age'])}, session_idle={written(rule['session_idle'])}"
    )


@retention.command("clear")
@_with_scope
@click.option("--entity-type", type=ENTITY_TYPE, help="Clear only this entity type's rule.")
@dry_run_option
@yes_option
@json_option
@click.pass_obj
def retention_clear(
    obj: Context,
    session_id: str | None,
    default: bool,
    entity_type: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete the rules of a session or of the default (what they expired shows again).
    On a terminal it first says what it will delete and asks; elsewhere it needs --yes;
    --dry-run only says."""
    scope = _scope(session_id, default)
    repository = obj.repository()
    shown = repository.retention(scope)
    if entity_type is None:
        kinds = (["every type"] if _any_field(shown) else []) + list(shown["by_type"])
    else:
        kinds = [entity_type] if entity_type in shown["by_type"] else []
    if not dry_run and kinds:
        go_ahead(
            f"retention clear deletes {plural(len(kinds), 'rule')} of {_scope_name(scope)} "
            f"({', '.join(kinds)})",
            yes,
        )
    deleted = len(kinds) if dry_run else repository.clear_retention(scope, entity_type=entity_type)
    if as_json:
        receipt = {
            "scope": _scope_name(scope),
            "entity_type": entity_type,
            "dry_run": dry_run,
            "deleted": deleted,
        }
        click.echo(json.dumps(receipt, ensure_ascii=False, indent=2))
        return
    click.echo(f"{plural(deleted, 'rule')} {'would be ' if dry_run else ''}deleted")


def _any_field(rule: dict[str, Any]) -> bool:
    return any(rule[field] is not None for field in ("keep_last", "max_age", "session_idle"))


@click.command()
@click.option(
    "--session", "session_id", type=SESSION_ID, help="One session (default: every session)."
)
@dry_run_option
@yes_option
@json_option
@click.pass_obj
def prune(obj: Context, session_id: str | None, dry_run: bool, yes: bool, as_json: bool) -> None:
    """Delete what the retention policies expired, in short batches (safe to rerun). On a
    terminal it first says what it will delete and asks; elsewhere it needs --yes (a
    scheduled job: `zerda-store prune --yes`); --dry-run only counts."""
    repository = obj.repository()
    if not dry_run and not yes:
        counted = repository.prune(session_id, dry_run=True)
        if not any(counted.values()):
            yes = True  # nothing to delete: nothing to ask
        go_ahead(f"prune deletes {_pruned(counted)}", yes)
    receipt = repository.prune(session_id, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **receipt}, indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb}: {_pruned(receipt)}")


def _pruned(receipt: dict[str, int]) -> str:
    return (
        f"{plural(receipt['sessions'], 'session')}, {plural(receipt['turns'], 'turn')}, "
        f"{plural(receipt['snippets'], 'snippet')}, {plural(receipt['entities'], 'entity')}"
    )
