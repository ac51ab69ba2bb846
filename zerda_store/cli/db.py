"""``db distribute``, thin over :mod:`distribution`, and what ``db upgrade`` says about the
data it changed (both registered on the ``db`` group by :mod:`cli`)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

import click

from .common import Context, print_text


@click.command("distribute")
@click.option(
    "--dry-run", is_flag=True, help="Print the statements and what blocks them; change nothing."
)
@click.pass_obj
def distribute(obj: Context, dry_run: bool) -> None:
    """Distribute the tables by session_id with Citus (needs the citus extension)."""
    from ..db import distribution

    if dry_run:
        plan = distribution.plan(obj.open(reading=True))
        for statement in plan.statements:
            print_text(f"{statement};")
        for blocker in plan.blockers:
            print_text(f"-- blocked: {blocker}")
        return
    for statement in distribution.distribute(obj.store):
        print_text(f"ran: {statement}")
    click.echo("tables distributed by session_id")


def undo_command(merge_id: int, session_id: str) -> str:
    """The command that undoes merge ``merge_id`` of ``session_id`` (quoted for a shell)."""
    return f"zerda-store unmerge {merge_id} --session {shlex.quote(session_id)}"


def print_upgrade(report: Sequence[dict[str, Any]], revision: str | None, as_json: bool) -> None:
    """What ``db upgrade`` did: per session, the merges made with the command undoing each,
    and the sessions kept exact for want of evidence; then the revision reached."""
    sessions = [
        {**entry, "merges": [{**m, "undo": undo_command(m["merge_id"], entry["session_id"])}
                             for m in entry["merges"]]}
        for entry in report
    ]  # fmt: skip
    if as_json:
        click.echo(json.dumps({"revision": revision, "sessions": sessions}, ensure_ascii=False))
        return
    for entry in sessions:
        for merged in entry["merges"]:
            print_text(
                f"session {entry['session_id']!r}: merged {merged['merged']!r} into "
                f"{merged['kept']!r} (merge {merged['merge_id']}, one key under "
                f"{entry['key_rules']}); undo with: {merged['undo']}"
            )
        if entry["unsure"]:
            print_text(
                f"session {entry['session_id']!r}: kept its keys as written (exact), as "
                "nothing it recorded shows normalize_names=True; if its application uses "
                "normalize_names=True: `zerda-store db downgrade 0005`, then "
                "`zerda-store db upgrade --assume-normalized`"
            )
    rekeyed = sum(1 for entry in sessions if entry["key_rules"] != "exact")
    merges = sum(len(entry["merges"]) for entry in sessions)
    if sessions:
        click.echo(
            f"{len(sessions)} sessions recorded: {rekeyed} re-keyed, {merges} merges "
            f"(`zerda-store merges --session S` lists them)"
        )
    click.echo(f"database at revision {revision}")
