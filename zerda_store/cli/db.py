"""``db distribute``: thin over :mod:`distribution` (registered on the ``db`` group)."""

from __future__ import annotations

import click

from ..db import distribution
from .common import Context, print_text


@click.command("distribute")
@click.option(
    "--dry-run", is_flag=True, help="Print the statements and what blocks them; change nothing."
)
@click.pass_obj
def distribute(obj: Context, dry_run: bool) -> None:
    """Distribute the tables by session_id with Citus (needs the citus extension)."""
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
