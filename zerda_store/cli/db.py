"""``db distribute``, thin over :mod:`db.citus.distribution`; ``db grant``, thin over
:mod:`db.migration.roles`; ``db rekey``, thin over :mod:`identity.rekeying`; ``db contract``, thin
over :mod:`db.migration.contract`; and what ``db upgrade`` and ``db rekey`` say about the data they
changed (registered on the ``db`` group by :mod:`cli.main`)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import click

from .common import SESSION_ID, Context, json_option, plural, print_text


@click.command("distribute")
@click.option(
    "--dry-run", is_flag=True, help="Print the statements and what blocks them; change nothing."
)
@json_option
@click.pass_obj
def distribute(obj: Context, dry_run: bool, as_json: bool) -> None:
    """Distribute the tables by session_id with Citus (needs the citus extension). The dry
    run prints the statements and exits 1 if anything blocks them. --json prints
    {"dry_run", "ran", "statements", "already_distributed", "functions", "blockers"}
    ("functions": the functions a save, a recall and the session's lock run as on the
    shards' workers, created again on every run); a run that is
    blocked changes nothing and is refused in one line (the dry run lists every blocker)."""
    from .. import migrate

    if dry_run:
        plan = migrate.distribution_plan(obj.open(reading=True))
    else:
        plan = migrate.distribute(obj.store)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "ran": not dry_run and bool(plan.statements or plan.functions),
                    "statements": plan.statements,
                    "already_distributed": plan.done,
                    "functions": function_names(plan.functions),
                    "blockers": plan.blockers,
                }
            )
        )
    elif dry_run:
        for table in plan.done:
            print_text(f"-- already distributed: {table}")
        for statement in plan.statements:
            print_text(f"{statement};")
        for statement in plan.functions:  # a function's body is long: its first line
            first = statement.splitlines()[0]
            print_text(f"-- {first} ..." if first.startswith("CREATE") else f"{statement};")
        for blocker in plan.blockers:
            print_text(f"-- blocked: {blocker}")
    else:
        for table in plan.done:
            print_text(f"already distributed: {table}")
        for statement in plan.statements:
            print_text(f"ran: {statement}")
        for name in function_names(plan.functions):
            print_text(f"created and distributed: {name}")
        if plan.statements:
            click.echo("tables distributed by session_id")
        elif plan.functions:
            click.echo("every table is distributed already: the functions were created again")
        else:
            click.echo("every table is distributed already: nothing ran")
    if plan.blockers:  # a deploy script's dry run must fail while the real one would
        raise click.ClickException(
            f"db distribute is blocked ({plural(len(plan.blockers), 'blocker')} "
            f"{'in blockers' if as_json else 'above'})"
        )


def undo_command(merge_id: int, session_id: str) -> str:
    """The command that undoes merge ``merge_id`` of ``session_id`` (quoted for a shell)."""
    return f"zerda-store unmerge {merge_id} --session {shlex.quote(session_id)}"


def print_rekeyed(report: Sequence[dict[str, Any]], as_json: bool, **extra: Any) -> None:
    """What ``db upgrade`` or ``db rekey`` did: per session, the merges made with the command
    undoing each (``undo`` None for one undone since), and the sessions kept exact for
    want of evidence. ``extra``: more fields of the JSON answer (``revision``)."""
    sessions = [
        {**entry, "merges": [{**m, "undo": None if m.get("undone") else
                              undo_command(m["merge_id"], entry["session_id"])}
                             for m in entry["merges"]]}
        for entry in report
    ]  # fmt: skip
    if as_json:
        click.echo(json.dumps({**extra, "sessions": sessions}, ensure_ascii=False))
        return
    for entry in sessions:
        for merged in entry["merges"]:
            undo = f"undo with: {merged['undo']}" if merged["undo"] else "undone since"
            print_text(
                f"session {entry['session_id']!r}: merged {merged['merged']!r} into "
                f"{merged['kept']!r} (merge {merged['merge_id']}, one key under "
                f"{entry['key_rules']}); {undo}"
            )
        if entry["unsure"]:
            print_text(
                f"session {entry['session_id']!r}: kept its keys as written (exact), as "
                "nothing it recorded shows normalize_names=True; if its application uses "
                "normalize_names=True: `zerda-store db downgrade 0005`, then "
                f"`zerda-store db upgrade --assume-normalized {shlex.quote(entry['session_id'])}`"
            )
    rekeyed = sum(1 for entry in sessions if entry["key_rules"] != "exact")
    merges = sum(len(entry["merges"]) for entry in sessions)
    if sessions:
        click.echo(
            f"{plural(len(sessions), 'session')} recorded: {rekeyed} re-keyed, "
            f"{plural(merges, 'merge')} "
            f"(`zerda-store merges --session S` lists them)"
        )


def print_upgrade(
    report: Sequence[dict[str, Any]], revision: str | None, as_json: bool, **extra: Any
) -> None:
    """What ``db upgrade`` did (:func:`print_rekeyed`), then the revision reached."""
    print_rekeyed(report, as_json, revision=revision, **extra)
    if not as_json:
        click.echo(f"database at revision {revision}")


@click.command("rekey")
@click.option(
    "--assume-normalized",
    "normalized",
    multiple=True,
    metavar="SESSION",
    type=SESSION_ID,
    help="A session the previous release began, whose keys do not show how it was keyed, "
    "was written with normalize_names=True (default: exact). Repeatable.",
)
@json_option
@click.pass_obj
def rekey(obj: Context, normalized: tuple[str, ...], as_json: bool) -> None:
    """Re-key what servers of the previous release saved since `db upgrade` (run once the
    last of them has stopped): session by session, short transactions; run again after an
    interruption. Prints each merge with the command that undoes it (those of a run that
    stopped before printing them too)."""
    from .. import migrate

    store = obj.changing_store()
    migrate.require_store_database(store)
    rekeying = migrate.Rekeying(store, assume_normalized=set(normalized))
    if idle := rekeying.without_effect(normalized):  # H8: never silently ignored
        raise click.UsageError(
            "--assume-normalized would change nothing for "
            + "; ".join(f"{s!r}: {why}" for s, why in idle.items())
            + "; nothing was re-keyed"
        )
    ran = [asdict(done) for done in rekeying.run(time.time)]
    report = migrate.unreported_merges(store, ran)  # and what a stopped run did not print
    print_rekeyed(report, as_json)
    if not as_json:
        click.echo(f"{plural(len(ran), 'session')} re-keyed")
    migrate.mark_merges_reported(store, report, time.time())


@click.command("contract")
@json_option
@click.pass_obj
def contract(obj: Context, as_json: bool) -> None:
    """Drop the defaults the schema keeps for servers of the previous release (the contract
    step of an upgrade): run once the last of them has stopped and `db rekey` has run.
    Refused, changing nothing, while entities `db rekey` would re-key remain."""
    from .. import migrate

    dropped = migrate.contract(obj.changing_store())
    if as_json:
        click.echo(json.dumps({"dropped_defaults": dropped}))
    elif dropped:
        for column in dropped:
            print_text(f"dropped the default of {column} (kept for the previous release)")
    else:
        click.echo("nothing to contract: no default of the previous release is left")


@click.command("grant")
@click.option(
    "--service",
    metavar="ROLE",
    help="The role the application runs as: reads and writes the memory's rows, never "
    "changes the schema.",
)
@click.option(
    "--inspector", metavar="ROLE", help="A role that reads the tables and views, never writes."
)
@click.option(
    "--create", is_flag=True, help="Create the roles that do not exist, NOLOGIN (needs CREATEROLE)."
)
@click.option("--dry-run", is_flag=True, help="Print the statements; change nothing.")
@json_option
@click.pass_obj
def grant(
    obj: Context,
    service: str | None,
    inspector: str | None,
    create: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Grant a service role and an inspection role what they need on zerda_store's tables,
    views and sequences, now and (default privileges) on what later upgrades create (Postgres;
    run as the tables' owner; running it again changes nothing). --json prints {"dry_run",
    "schema", "owner", "service", "inspector", "created", "statements", "warnings"}."""
    from .. import migrate

    if dry_run:
        done = migrate.grant_plan(
            obj.open(reading=True), service=service, inspector=inspector, create=create
        )
    else:
        done = migrate.grant(obj.store, service=service, inspector=inspector, create=create)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **asdict(done)}))
        return
    for statement in done.statements:
        print_text(f"{statement};" if dry_run else f"ran: {statement}")
    for warning in done.warnings:
        print_text(f"{'-- ' if dry_run else ''}warning: {warning}")
    if not dry_run:
        granted = [
            f"{kind} {role}"
            for kind, role in (("service", service), ("inspector", inspector))
            if role
        ]
        click.echo(
            f"granted on schema {done.schema} (owner {done.owner}) to {' and '.join(granted)}"
        )


def function_names(statements: list[str]) -> list[str]:
    """The functions ``db distribute`` creates, by name, from their statements."""
    return [
        line.split("FUNCTION ", 1)[1].split("(", 1)[0]
        for statement in statements
        for line in statement.splitlines()[:1]
        if line.startswith("CREATE OR REPLACE FUNCTION ")
    ]
