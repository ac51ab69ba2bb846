"""The identity commands: ``alias``, ``merge``, ``unmerge``, ``merges``, the listing
behind ``entities --similar`` and the judgements of its pairs (``similar confirm``,
``similar reject``, ``similar undo``, ``similar judgements``); thin over
:class:`ConversationEntityMemory`'s identity API.

A merge is never made for the operator: ``entities --similar`` only suggests pairs, and
each merge is logged so that ``unmerge`` (or ``similar undo``) can undo it exactly."""

from __future__ import annotations

import getpass
import json
import shlex
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from .. import ConversationEntityMemory

from .common import (
    NAME,
    SESSION_ID,
    Context,
    json_option,
    output,
    plural,
    print_text,
    session_option,
    when,
)

# Merge ids are 64-bit row ids: a larger number names no merge (and no driver takes it).
_MERGE_ID = click.IntRange(1, 2**63 - 1)


def session_memory(obj: Context, session_id: str, *, reading: bool) -> ConversationEntityMemory:
    """The existing session's memory, in its own key mode: on a read-only store for
    reading, else on a writable one (a read-only store is refused before anything)."""
    from .. import ConversationEntityMemory
    from ..admin import AdminRepository

    store = obj.reading_store() if reading else obj.changing_store()
    if not reading:
        store.check_writable()
    if not AdminRepository(store).session_exists(session_id):
        raise LookupError(f"no session {session_id!r} in this database")
    return ConversationEntityMemory.for_session(store, session_id)


def _command(*words: str) -> str:
    """A command line an operator can paste (arguments quoted for the shell)."""
    return "zerda-store " + " ".join(shlex.quote(word) for word in words)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


# -- aliases ------------------------------------------------------------------------------


@click.group()
def alias() -> None:
    """Add, remove or list a session's aliases (other names of an entity)."""


@alias.command("add")
@click.argument("name", type=NAME)
@click.argument("alias_name", metavar="ALIAS", type=NAME)
@session_option
@json_option
@click.pass_obj
def alias_add(obj: Context, name: str, alias_name: str, session_id: str, as_json: bool) -> None:
    """Make ALIAS another name of the entity NAME: a mention of ALIAS then names it."""
    memory = session_memory(obj, session_id, reading=False)
    added = memory.add_alias(name, alias_name)
    info = memory.get_entity_info(name)
    entity = info["name"] if info is not None else name
    if as_json:
        _print_json({"alias": alias_name, "entity": entity, "added": added})
    elif added:
        print_text(f"{alias_name!r} is now an alias of {entity!r}")
    else:
        print_text(f"{alias_name!r} was an alias of {entity!r} already")


@alias.command("remove")
@click.argument("alias_name", metavar="ALIAS", type=NAME)
@session_option
@json_option
@click.pass_obj
def alias_remove(obj: Context, alias_name: str, session_id: str, as_json: bool) -> None:
    """Stop ALIAS naming its entity (the entity and its snippets stay)."""
    memory = session_memory(obj, session_id, reading=False)
    if not memory.remove_alias(alias_name):
        raise LookupError(f"no alias {alias_name!r} in session {session_id!r}")
    if as_json:
        _print_json({"alias": alias_name, "removed": True})
        return
    print_text(f"removed the alias {alias_name!r}")


@alias.command("list")
@session_option
@json_option
@click.pass_obj
def alias_list(obj: Context, session_id: str, as_json: bool) -> None:
    """List a session's aliases: entity, alias and source (manual, merge or mention)."""
    rows = session_memory(obj, session_id, reading=True).aliases()
    output(rows, as_json, ("entity", "alias", "source"))


# -- merges -------------------------------------------------------------------------------


@click.command()
@click.argument("keep", type=NAME)
@click.argument("other", type=NAME)
@session_option
@json_option
@click.pass_obj
def merge(obj: Context, keep: str, other: str, session_id: str, as_json: bool) -> None:
    """Merge the entity OTHER into KEEP: its snippets and aliases move, its name becomes
    an alias of KEEP. Logged, and undone exactly by `unmerge`."""
    receipt = session_memory(obj, session_id, reading=False).merge_entities(keep, other)
    if as_json:
        _print_json(receipt)
        return
    print_text(
        f"merged {receipt['merged']!r} into {receipt['kept']!r} (merge {receipt['merge_id']}): "
        f"{plural(receipt['moved_snippets'], 'snippet')} moved, {receipt['dropped_snippets']} dropped "
        f"(same turn), {receipt['moved_aliases']} aliases moved"
    )
    print_text(
        f"undo with: {_command('unmerge', str(receipt['merge_id']), '--session', session_id)}"
    )


@click.command()
@click.argument("merge_id", type=_MERGE_ID)
@session_option
@json_option
@click.pass_obj
def unmerge(obj: Context, merge_id: int, session_id: str, as_json: bool) -> None:
    """Undo merge MERGE_ID (see `merges`): both entities as they were before it."""
    entry = session_memory(obj, session_id, reading=False).unmerge(merge_id)
    if as_json:
        _print_json(entry)
        return
    print_text(
        f"undid merge {entry['merge_id']}: {entry['kept']!r} and {entry['merged']!r} "
        "are two entities again"
    )


@click.command()
@click.option(
    "--session",
    "session_id",
    type=SESSION_ID,
    help="The session id (or --reason for every session).",
)
@click.option(
    "--reason",
    help='Only the merges of this reason: "key rules" (made by `db upgrade` and `db rekey`), '
    '"manual", "confirmed same"; without --session, of every session.',
)
@json_option
@click.pass_obj
def merges(obj: Context, session_id: str | None, reason: str | None, as_json: bool) -> None:
    """List a session's merge log, oldest first (undone merges too), or with --reason the
    merges of that reason across sessions, each with the command that undoes it."""
    if session_id is None and reason is None:
        raise click.UsageError("name the session (--session S), or a reason (--reason R)")
    if session_id is None:
        assert reason is not None
        rows = [
            {
                **row,
                "undo": None
                if row["undone_at"] is not None
                else _command("unmerge", str(row["merge_id"]), "--session", row["session_id"]),
            }
            for row in obj.reader().merges_by_reason(reason)
        ]
        columns: tuple[str, ...] = ("session", "id", "kept", "merged", "when", "undone", "undo")
    else:
        rows = session_memory(obj, session_id, reading=True).merges()
        if reason is not None:
            rows = [row for row in rows if row["reason"] == reason]
        columns = ("id", "kept", "merged", "reason", "when", "undone")
    output(
        rows,
        as_json,
        columns,
        lambda row: {
            **row,
            "session": row.get("session_id"),
            "id": row["merge_id"],
            "when": when(row["created_at"]),
            "undone": when(row["undone_at"]),
            "undo": row.get("undo") or "",
        },
    )


def similar_listing(obj: Context, session_id: str, as_json: bool, limit: int | None = None) -> None:
    """``entities --similar``: pairs of entities that may be one, with how to judge them."""
    rows = session_memory(obj, session_id, reading=True).similar_entities(limit=limit)
    output(rows, as_json, ("a", "b", "reason", "score"))
    if not as_json and rows:
        print_text(
            "never merged automatically; to merge B into A: "
            + _command("similar", "confirm", "A", "B", "--session", session_id)
            + "; to never suggest the pair again: "
            + _command("similar", "reject", "A", "B", "--session", session_id)
        )


# -- judgements ---------------------------------------------------------------------------


def _decider() -> str:
    """Who decides, when --by does not say: the operating-system user."""
    try:
        return getpass.getuser() or "cli"
    except (KeyError, OSError):
        return "cli"


_by_option = click.option(
    "--by",
    "decided_by",
    help="Who decided (kept with the judgement); default: the operating-system user.",
)


@click.group()
def similar() -> None:
    """Judge the pairs `entities --similar` suggests: confirm, reject, undo, list."""


@similar.command("confirm")
@click.argument("a", type=NAME)
@click.argument("b", type=NAME)
@session_option
@_by_option
@json_option
@click.pass_obj
def similar_confirm(
    obj: Context, a: str, b: str, session_id: str, decided_by: str | None, as_json: bool
) -> None:
    """Judge A and B one entity: B is merged into A (logged; `similar undo A B` undoes it)."""
    memory = session_memory(obj, session_id, reading=False)
    judgement = memory.confirm_same(a, b, by=decided_by or _decider())
    if as_json:
        _print_json(judgement)
        return
    print_text(
        f"{judgement['b']!r} merged into {judgement['a']!r} (merge {judgement['merge_id']}); "
        f"undo with: {_command('similar', 'undo', a, b, '--session', session_id)}"
    )


@similar.command("reject")
@click.argument("a", type=NAME)
@click.argument("b", type=NAME)
@session_option
@_by_option
@json_option
@click.pass_obj
def similar_reject(
    obj: Context, a: str, b: str, session_id: str, decided_by: str | None, as_json: bool
) -> None:
    """Judge A and B two entities: the pair is never suggested again in the session."""
    memory = session_memory(obj, session_id, reading=False)
    judgement = memory.reject_same(a, b, by=decided_by or _decider())
    if as_json:
        _print_json(judgement)
        return
    print_text(
        f"{judgement['a']!r} and {judgement['b']!r} are two entities: not suggested again; "
        f"undo with: {_command('similar', 'undo', a, b, '--session', session_id)}"
    )


@similar.command("undo")
@click.argument("a", type=NAME)
@click.argument("b", type=NAME)
@session_option
@json_option
@click.pass_obj
def similar_undo(obj: Context, a: str, b: str, session_id: str, as_json: bool) -> None:
    """Undo the judgement of A and B: a confirmation is unmerged, a rejection removed."""
    judgement = session_memory(obj, session_id, reading=False).undo_judgement(a, b)
    if as_json:
        _print_json(judgement)
        return
    if judgement["verdict"] == "different":
        what = "the pair may be suggested again"
    elif judgement["merge_id"] is not None:
        what = "the two entities are unmerged"
    else:  # imported or copied: its merge was made in another database
        what = "its merge is not in this database's log (`alias remove` takes the name back)"
    print_text(f"undid the judgement of {judgement['a']!r} and {judgement['b']!r}: {what}")


@similar.command("judgements")
@session_option
@json_option
@click.pass_obj
def similar_judgements(obj: Context, session_id: str, as_json: bool) -> None:
    """List a session's judgements, oldest first: a, b, verdict, who and when."""
    rows = session_memory(obj, session_id, reading=True).judgements()
    output(
        rows,
        as_json,
        ("a", "b", "verdict", "by", "when"),
        lambda row: {**row, "by": row["decided_by"], "when": when(row["decided_at"])},
    )
