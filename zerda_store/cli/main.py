"""The ``zerda-store`` command line: thin commands over the Python API.

Expected failures (bad URL, unreachable database, schema behind, missing entity) print one
line and exit non-zero; they never show a traceback. Each command imports the parts of the
library it uses, so that ``zerda-store --help`` starts quickly.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .citus import citus
from .common import (
    MAX_COUNT,
    NAME,
    SESSION_ID,
    Context,
    Group,
    dry_run_option,
    escaped,
    go_ahead,
    json_option,
    output,
    plural,
    print_text,
    refusals_are_usage_errors,
    require_session,
    session_option,
    when,
    yes_option,
)
from .db import contract, distribute, grant, print_rekeyed, print_upgrade, rekey
from .extraction import models, reextract
from .identity import alias, merge, merges, similar, similar_listing, unmerge
from .retention import prune, retention
from .schema import Revision, check_assumptions, db_check, db_current, db_downgrade, revision_slugs
from .transfer import copy, export_command, import_command

# The environment variable of the database URL (``db.urls.DATABASE_URL_ENV``, which a
# test holds this to), named here so that reading the options loads no engine.
DATABASE_URL_ENV = "ZERDA_STORE_DATABASE_URL"
# More snippets than an operator reads; a bound also keeps numbers beyond the databases'
# 64-bit LIMIT out of the query (every snippet: Entity.contexts in the Python API).
MAX_SNIPPETS_SHOWN = 10_000


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="zerda-store", prog_name="zerda-store")
@click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    show_envvar=True,
    help="Database URL (default: sqlite:///zerda_store.db in the working folder).",
)
@click.option(
    "--read-only",
    is_flag=True,
    help="Open the database read-only: commands that would change it fail. (Reading "
    "commands always open it so, and never create or migrate a database.)",
)
@click.option(
    "--schema",
    help="Postgres schema that holds zerda_store's tables (put first on the search_path; "
    "`db upgrade` creates it).",
)
@click.pass_context
def main(ctx: click.Context, database_url: str | None, read_only: bool, schema: str | None) -> None:
    """Inspect and manage a zerda_store entity memory."""
    ctx.obj = Context(database_url, read_only=read_only, schema=schema)
    ctx.call_on_close(ctx.obj.close)


for command in (
    reextract,
    models,
    export_command,
    import_command,
    copy,
    retention,
    prune,
    alias,
    merge,
    unmerge,
    merges,
    similar,
):
    main.add_command(command)


# -- schema -----------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Manage the database schema (Alembic migrations)."""


for db_command in (distribute, citus, db_downgrade, db_current, db_check, rekey, contract, grant):
    db.add_command(db_command)


@db.command("upgrade")
@click.argument("revision", default="head", type=Revision())
@click.option(
    "--assume-normalized",
    "normalized",
    multiple=True,
    metavar="SESSION",
    type=SESSION_ID,
    help="A session whose records do not tell how it was keyed was written with "
    "normalize_names=True: re-key it (default: keep its keys, as exact). Repeatable.",
)
@click.option(
    "--assume-all-normalized", is_flag=True, help="As --assume-normalized for every session."
)
@json_option
@click.pass_obj
def db_upgrade(
    obj: Context,
    revision: str,
    normalized: tuple[str, ...],
    assume_all_normalized: bool,
    as_json: bool,
) -> None:
    """Upgrade the schema to REVISION (default: head); print the merges it made, each with
    the command that undoes it (those of an earlier run that stopped before printing them
    too: the report comes from the merge log)."""
    from .. import migrate

    assumed = True if assume_all_normalized else set(normalized)
    if assumed:
        check_assumptions(obj, normalized)
    report: list[dict[str, Any]] = []
    ran: list[str] = []  # the revisions this run applied (another job may apply others)
    try:
        migrate.upgrade(
            obj.store,
            revision,
            assume_normalized=assumed,
            report=report,
            applied=ran,
            acknowledge=False,  # reported once printed, below
        )
    except BaseException:
        if report:  # committed before the failure: the merges made and how to undo them
            print_rekeyed(report, as_json, interrupted=True)
        raise
    reached = migrate.current_revision(obj.store)
    applied = revision_slugs(ran)
    if not as_json:
        for applied_revision, slug in applied:
            print_text(f"applied {applied_revision} ({slug})")
        if not applied:
            click.echo("nothing to apply: the database was at that revision already")
    print_upgrade(report, reached, as_json, applied=[rev for rev, _ in applied])
    migrate.acknowledge_report(obj.store, report)


# -- inspection ---------------------------------------------------------------------------


@main.command()
@click.option(
    "--include-expired",
    is_flag=True,
    help="Also list the sessions of which a retention policy has expired everything (not "
    "yet pruned), and count what is stored rather than what the reads show.",
)
@json_option
@click.pass_obj
def sessions(obj: Context, include_expired: bool, as_json: bool) -> None:
    """List the sessions with their entity and turn counts (as the reads show them;
    --include-expired: everything stored, as an erasure must reach it)."""
    rows = [
        {
            "session_id": s.session_id,
            "entity_count": s.entity_count,
            "message_count": s.message_count,
            "last_activity": s.last_activity,
        }
        for s in obj.reader().sessions(include_expired=include_expired)
    ]
    output(
        rows,
        as_json,
        ("session_id", "entity_count", "message_count", "last_activity"),
        lambda row: {**row, "last_activity": when(row["last_activity"])},
    )


@main.command()
@session_option
@click.option(
    "--similar",
    "similar_pairs",
    is_flag=True,
    help="List pairs of entities that may be one (a, b, reason, score) instead; never "
    "merged automatically (see `similar confirm` and `similar reject`).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_COUNT),
    help="With --similar: at most this many pairs, the likeliest first.",
)
@json_option
@click.pass_obj
def entities(
    obj: Context, session_id: str, similar_pairs: bool, limit: int | None, as_json: bool
) -> None:
    """List a session's entities in first-seen order (or, with --similar, likely duplicates)."""
    if similar_pairs:
        similar_listing(obj, session_id, as_json, limit)
        return
    require_session(obj, session_id)
    rows = [
        {
            "name": e.name,
            "type": e.entity_type,
            "contexts_count": e.contexts_count,
            "first_seen": e.first_seen,
            "last_seen": e.last_seen,
        }
        for e in obj.reader().entity_summaries(session_id)
    ]
    output(
        rows,
        as_json,
        ("name", "type", "contexts_count", "first_seen", "last_seen"),
        lambda row: {
            **row,
            "first_seen": when(row["first_seen"]),
            "last_seen": when(row["last_seen"]),
        },
    )


@main.command()
@click.argument("name", type=NAME)
@session_option
@click.option(
    "--limit",
    default=3,
    show_default=True,
    type=click.IntRange(1, MAX_SNIPPETS_SHOWN),
    help="How many recent snippets to show.",
)
@json_option
@click.pass_obj
def entity(obj: Context, name: str, session_id: str, limit: int, as_json: bool) -> None:
    """Show what the memory knows about one entity (NAME is matched as the API matches it)."""
    memory = obj.memory_knowing(session_id, name)
    info = memory.get_entity_info(name)
    assert info is not None
    info["recent_contexts"] = memory.entity_store[name].get_recent_contexts(limit)
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False, indent=2))
        return
    print_text(f"{escaped(info['name'])} ({escaped(info['type'])})")
    print_text(f"  snippets:   {info['contexts_count']}")
    print_text(f"  first seen: {when(info['first_seen'])}")
    print_text(f"  last seen:  {when(info['last_seen'])}")
    print_text("  recent snippets, oldest first:")
    for snippet in info["recent_contexts"]:
        print_text(f"    - {escaped(snippet)}")  # one line per snippet, whatever it holds


@main.command()
@click.option(
    "--session", "session_id", type=SESSION_ID, help="One session (default: every session)."
)
@json_option
@click.pass_obj
def stats(obj: Context, session_id: str | None, as_json: bool) -> None:
    """Show memory statistics of one session or of every session."""
    if session_id is not None:
        require_session(obj, session_id)
    ids = [session_id] if session_id else [s.session_id for s in obj.reader().sessions()]
    rows = [{"session_id": i, **obj.memory(i).get_memory_stats()} for i in ids]
    if session_id is not None and as_json:
        click.echo(json.dumps(rows[0], ensure_ascii=False, indent=2))
        return
    output(rows, as_json, ("session_id", "entity_count", "message_count", "total_contexts"))


# -- changes ------------------------------------------------------------------------------


# What a receipt of forget_entity counts as erased.
_ERASED = ("entities", "contexts", "turns_deleted", "turns_updated")


@main.command()
@click.argument("name", type=NAME)
@session_option
@click.option("--with-turns", is_flag=True, help="Also delete the turns that mention it.")
@dry_run_option
@yes_option
@json_option
@click.pass_obj
def forget(
    obj: Context,
    name: str,
    session_id: str,
    with_turns: bool,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Erase an entity and its snippets (and, --with-turns, the turns that mention it),
    and print what was deleted. On a terminal it first says what it will delete and asks;
    elsewhere it needs --yes; --dry-run only says."""
    memory = obj.session_memory(session_id)
    planned = memory.forget_entity(name, with_turns=with_turns, dry_run=True)
    if not any(planned[count] for count in _ERASED):
        raise LookupError(f"no entity {name!r} in session {session_id!r}")
    if not dry_run:
        go_ahead(f"forget {name!r} in session {session_id!r}: {_erased(planned)}", yes)
    receipt = planned if dry_run else memory.forget_entity(name, with_turns=with_turns)
    if as_json:
        click.echo(json.dumps(receipt, ensure_ascii=False, indent=2))  # as the API gives it
        return
    verb = "would forget" if dry_run else "forgot"
    print_text(f"{verb} {receipt['entity']!r}: {_erased(receipt)}")


def _erased(receipt: dict[str, Any]) -> str:
    """What a forget receipt counts, in words."""
    return (
        f"{plural(receipt['entities'], 'entity')}, {plural(receipt['contexts'], 'snippet')}, "
        f"{plural(receipt['turns_deleted'], 'turn')} deleted, "
        f"{plural(receipt['turns_updated'], 'turn')} updated"
    )


@main.command()
@json_option
@click.pass_obj
def demo(obj: Context, as_json: bool) -> None:
    """Run a short scripted CRM conversation and show what the memory recalls (the schema
    is created first in an empty database). Run it twice: the memory survives."""
    from .. import migrate
    from .demo import run_demo

    migrate.prepare_for_new_data(obj.store)
    summary = run_demo(obj.store, (lambda _: None) if as_json else print_text)
    if as_json:
        click.echo(json.dumps(summary, ensure_ascii=False, indent=2))


refusals_are_usage_errors(main)  # exit codes by one rule: 0 ok, 1 failure, 2 usage
