"""The ``zerda-store`` commands that move data: export, import and copy."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import IO, Any

import click

from .common import (
    SESSION_ID,
    Context,
    json_option,
    plural,
    print_text,
    require_session,
    session_option,
)
from .progress import row_bar


@click.command("export")
@session_option
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, allow_dash=True),
    required=True,
    help="File to write (JSON Lines); - for standard output. Written whole or not at all.",
)
@click.option(
    "--include-expired",
    is_flag=True,
    help="Also write what the session's retention policy has expired but not yet pruned "
    "(by default it is left out, as every read leaves it out).",
)
@click.pass_obj
def export_command(obj: Context, session_id: str, output: str, include_expired: bool) -> None:
    """Write one session (turns, entities, snippets, timestamps) as JSON Lines, ending
    with a line of counts and a checksum that `import` requires. What the session's
    retention policy has expired is left out unless --include-expired."""
    from ..transfer import write_session, write_session_file

    if output != "-":
        obj.refuse_own_file(output)
    require_session(obj, session_id)
    reader = obj.reader()
    rules = reader.key_rules(session_id)
    policy = reader.carried_policy(session_id)
    with row_bar("export", reader.row_counts([session_id])) as bar:
        records = bar.counted(reader.export_session(session_id, include_expired=include_expired))
        if output == "-":
            lines = write_session(sys.stdout, session_id, records, rules, policy)
        else:
            with _file_errors(output):
                lines = write_session_file(output, session_id, records, rules, policy)
    including = " including expired data" if include_expired else ""
    click.echo(
        f"exported session {session_id!r}{including}: {plural(lines, 'line')}"
        + (f"; {_policy_count(policy)} carried" if policy else ""),
        err=True,
    )


def _policy_count(policy: dict[str, Any]) -> str:
    """``2 retention rules`` (the session's own and the default's)."""
    count = sum(len(rules) for rules in policy.values())
    return f"{count} retention rule{'s' if count != 1 else ''}"


@contextmanager
def _file_errors(path: str) -> Iterator[None]:
    """A file that cannot be read or written (no such folder, a full disk) is one line."""
    try:
        yield
    except OSError as exc:
        raise click.ClickException(f"cannot use {path}: {exc.strerror or exc}") from None


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@session_option
@click.option("--merge", is_flag=True, help="Add to a session that already holds data.")
@click.option(
    "--unverified",
    is_flag=True,
    help="Accept a file of the first export format, which has no end line to verify.",
)
@json_option
@click.pass_obj
def import_command(
    obj: Context, file: str, session_id: str, merge: bool, unverified: bool, as_json: bool
) -> None:
    """Read a session exported by `export` into SESSION, in one transaction. The whole
    file is checked first; a bad or truncated file is refused, and nothing is written.
    An empty database gets zerda_store's schema first."""
    from ..transfer import ExportFile, checked_session_id, described, file_key_rules

    checked_session_id(session_id)
    with _file_errors(file), _readable(file) as path:
        export = ExportFile(path)
        checked = export.check(allow_unverified=unverified)
        repository = obj.importing_repository()
        with row_bar("import", sum(checked.counts.values())) as bar:
            counts = repository.import_session(
                session_id, bar.counted(export), merge=merge, key_rules=file_key_rules(checked)
            )
        carried = repository.record_carried(session_id, checked.retention)
    if as_json:
        receipt = {"session_id": session_id, **counts, **carried}
        click.echo(json.dumps(receipt, ensure_ascii=False))
        return
    print_text(
        f"imported into {session_id!r}: {plural(counts['turns'], 'turn')}, "
        f"{plural(counts['entities'], 'entity')}, {plural(counts['contexts'], 'snippet')}"
        + (
            f", {counts['aliases']} {_ALIASES[counts['aliases'] == 1]}"
            if "aliases" in counts
            else ""
        )
        + (f"; {described(carried)}" if carried["retention"] != "none" else "")
    )


_ALIASES = ("aliases", "alias")


@contextmanager
def _readable(file: str) -> Iterator[str]:
    """A private copy of ``file`` (or of standard input), read from it once: the import
    checks and then writes this copy, never the operator's path again. A stream such as
    ``<(gunzip -c backup.gz)`` can be read only once, and a file replaced between the check
    and the write would have its unchecked records imported."""
    with tempfile.NamedTemporaryFile("w+b", suffix=".jsonl") as private:
        if file == "-":
            _copy(sys.stdin.buffer, private)
        else:
            with open(file, "rb") as source:
                _copy(source, private)
        private.flush()
        yield private.name


def _copy(source: IO[bytes], target: IO[bytes]) -> None:
    shutil.copyfileobj(source, target)


@click.command()
@click.option("--to", "destination", required=True, help="URL of the database to copy into.")
@click.option(
    "--session", "session_id", type=SESSION_ID, help="Copy one session (default: every session)."
)
@click.option(
    "--include-expired",
    is_flag=True,
    help="Also copy what retention policies have expired but not yet pruned (by default "
    "it is left out, and so are sessions of which everything expired).",
)
@json_option
@click.pass_obj
def copy(
    obj: Context, destination: str, session_id: str | None, include_expired: bool, as_json: bool
) -> None:
    """Copy sessions into another database (e.g. SQLite to Postgres); an empty one gets
    zerda_store's schema first. What a retention policy has expired is not copied unless
    --include-expired.

    Sessions that already hold data there are skipped, so an interrupted copy can be run
    again to finish it.
    """
    from .. import Store, migrate

    target = Store.resolve_url(destination)
    if target.get_backend_name() == "sqlite" and target.database not in (None, "", ":memory:"):
        obj.refuse_own_file(str(target.database))
    source = obj.reader()
    ids = [session_id] if session_id else source.session_ids(include_expired=include_expired)
    if session_id:
        require_session(obj, session_id)
    with obj.open_store(destination) as target_store:
        migrate.prepare_for_new_data(target_store)
        with row_bar("copy", source.row_counts(ids)) as bar:
            report = source.copy_to(target_store, ids, bar.counted, include_expired=include_expired)
    if as_json:
        click.echo(json.dumps(asdict(report)))
        return
    including = " including expired data" if include_expired else ""
    click.echo(
        f"copied {plural(report.copied, 'session')}{including}, "
        f"skipped {report.skipped} already present"
        + (
            f"; retention rules carried: {report.default_rules} of the default, "
            f"{report.session_rules} of sessions"
            if report.default_rules or report.session_rules
            else ""
        )
    )
