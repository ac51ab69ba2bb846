"""The ``zerda-store`` commands that move data: export, import and copy."""

from __future__ import annotations

import sys
from typing import IO

import click
from tqdm import tqdm

from . import migrate
from .cli_common import Context, require_session, session_option
from .engine import Store
from .transfer import read_session, write_session
from .validation import checked_session_id


@click.command("export")
@session_option
@click.option(
    "-o",
    "--output",
    "output",
    type=click.File("w", encoding="utf-8"),
    required=True,
    help="File to write (JSON Lines); - for standard output.",
)
@click.pass_obj
def export_command(obj: Context, session_id: str, output: IO[str]) -> None:
    """Write one session (turns, entities, snippets, timestamps) as JSON Lines."""
    require_session(obj, session_id)
    repository = obj.repository()
    records = tqdm(
        repository.export_session(session_id),
        desc="export",
        unit=" rows",
        disable=None,
        file=sys.stderr,
    )
    lines = write_session(output, session_id, records)
    click.echo(f"exported session {session_id!r}: {lines} lines", err=True)


@click.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@session_option
@click.option("--merge", is_flag=True, help="Add to a session that already holds data.")
@click.pass_obj
def import_command(obj: Context, file: IO[str], session_id: str, merge: bool) -> None:
    """Read a session exported by `export` into SESSION, in one transaction."""
    checked_session_id(session_id)
    lines = tqdm(file, desc="read", unit=" lines", disable=None, file=sys.stderr)
    _, records = read_session(lines)
    counts = obj.repository().import_session(session_id, records, merge=merge)
    click.echo(
        f"imported into {session_id!r}: {counts['turns']} turns, {counts['entities']} entities, "
        f"{counts['contexts']} snippets"
    )


@click.command()
@click.option("--to", "destination", required=True, help="URL of the database to copy into.")
@click.option("--session", "session_id", help="Copy one session (default: every session).")
@click.pass_obj
def copy(obj: Context, destination: str, session_id: str | None) -> None:
    """Copy sessions into another database (e.g. SQLite to Postgres).

    Sessions that already hold data there are skipped, so an interrupted copy can be run
    again to finish it.
    """
    source = obj.repository()
    ids = [session_id] if session_id else [s.session_id for s in source.sessions()]
    if session_id:
        require_session(obj, session_id)
    with Store(destination) as target_store:
        migrate.ensure_schema(target_store, auto_migrate=None)
        report = source.copy_to(
            target_store,
            ids,
            lambda items: tqdm(items, desc="copy", unit=" sessions", disable=None, file=sys.stderr),
        )
    click.echo(f"copied {report.copied} sessions, skipped {report.skipped} already present")
