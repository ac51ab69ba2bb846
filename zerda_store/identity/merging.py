"""Merging two entities of a session, and undoing it exactly.

A merge moves the merged entity's snippets and aliases to the kept one, drops the merged
entity's snippet of a turn the kept one has a snippet of too (one snippet per entity per
turn), makes the merged entity's name an alias of the kept one, and takes the earlier
first sighting and the later last one. The merge log (``entity_merges``) records all of
it, so that :func:`unmerge` puts back both entities as they were: rows, ids, snippets
and their order, aliases, first and last seen. Snippets saved after the merge stay with
the kept entity.

These functions run inside a unit of work holding the session's lock exclusively (or
inside a migration); they take a :class:`Transaction` and the compiled
:class:`IdentityStatements`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..db.execution.unit_of_work import Transaction
from ..errors import MergeError
from ..model.names import UNKNOWN_TYPE, held_apart_key
from .statements import CONTEXT_COLUMNS, ENTITY_COLUMNS, IdentityStatements

MANUAL = "manual"
KEY_RULES_REASON = "key rules"
# Fields of the kept entity that a merge may change, and an unmerge puts back.
_KEPT_FIELDS = ("name", "entity_type", "first_seen", "last_seen", "first_turn_id", "first_position")


@dataclass(frozen=True)
class MergeReceipt:
    """What a merge did."""

    merge_id: int
    kept: str
    merged: str
    moved_snippets: int
    dropped_snippets: int
    moved_aliases: int


def _row(row: Any, columns: tuple[str, ...]) -> dict[str, Any]:
    return {column: getattr(row, column) for column in columns}


def merge(
    transaction: Transaction,
    statements: IdentityStatements,
    kept: Any,
    merged: Any,
    *,
    reason: str,
    at: float,
    alias: bool = True,
) -> MergeReceipt:
    """Merge entity row ``merged`` into entity row ``kept`` (rows with every column);
    ``alias``: the merged entity's name becomes an alias of the kept one."""
    if kept.id == merged.id:
        raise MergeError(f"{kept.name!r} and {merged.name!r} are one entity already")
    kept, merged = _locked(transaction, statements, kept, merged)
    # Every statement names the session: Citus then runs it on the session's shard alone.
    session = {"session_id": kept.session_id}
    kept_turns = {
        row.turn_id
        for row in transaction.run(statements.contexts_of, {**session, "entity_id": kept.id})
        if row.turn_id is not None
    }
    own = transaction.run(statements.contexts_of, {**session, "entity_id": merged.id})
    dropped = [row for row in own if row.turn_id is not None and row.turn_id in kept_turns]
    for row in dropped:
        transaction.count(statements.delete_context, {**session, "context_id": row.id})
    dropped_ids = {row.id for row in dropped}
    moved = [row.id for row in own if row.id not in dropped_ids]
    move = {**session, "from_id": merged.id, "to_id": kept.id}
    transaction.count(statements.move_contexts, move)
    aliases = transaction.run(statements.aliases_of, {**session, "entity_id": merged.id})
    transaction.count(statements.move_aliases, move)
    transaction.count(statements.delete_entity, {**session, "entity_id": merged.id})
    alias_id = _add_alias(transaction, statements, kept.id, merged, at) if alias else None
    before = _row(kept, _KEPT_FIELDS)
    after = _combined(kept, merged)
    transaction.count(statements.update_first_last, {**session, "entity_id": kept.id, **after})
    record = {
        "kept_key": kept.name_key,
        "merged": _row(merged, ENTITY_COLUMNS),
        "kept_before": before,
        "kept_after": after,
        "moved_contexts": moved,
        "dropped_contexts": [_row(row, CONTEXT_COLUMNS) for row in dropped],
        "moved_aliases": [row.id for row in aliases],
        "alias_id": alias_id,
    }
    merge_id = transaction.run(
        statements.log_merge,
        {
            "session_id": kept.session_id,
            "kept_entity_id": kept.id,
            "merged_entity_id": merged.id,
            "kept_name": kept.name,
            "merged_name": merged.name,
            "reason": reason,
            "record": record,
            "created_at": at,
        },
    )[0].id
    return MergeReceipt(
        int(merge_id), kept.name, merged.name, len(moved), len(dropped), len(aliases)
    )


def _locked(
    transaction: Transaction, statements: IdentityStatements, kept: Any, merged: Any
) -> tuple[Any, Any]:
    """Both entities locked (in key order, as saves take them) with the fields saves change
    read again: a save that holds either has committed, and its snippet is read and moved
    with the others; a later one waits for the merge (a save of the previous release takes
    no session lock, so the session's lock alone does not keep it out). Deleting the
    merged entity would otherwise delete the snippet that save added meanwhile."""
    values = {"session_id": kept.session_id, "kept_id": kept.id, "merged_id": merged.id}
    fresh = {row.id: row for row in transaction.run(statements.lock_pair, values)}
    if len(fresh) != 2:
        raise MergeError(f"{kept.name!r} or {merged.name!r} is gone (forgotten meanwhile?)")

    def updated(row: Any) -> Any:
        return row._replace(**{name: getattr(fresh[row.id], name) for name in _KEPT_FIELDS})

    return updated(kept), updated(merged)


def _add_alias(
    transaction: Transaction, statements: IdentityStatements, entity_id: int, merged: Any, at: float
) -> int | None:
    rows = transaction.run(
        statements.add_alias,
        {
            "session_id": merged.session_id,
            "entity_id": entity_id,
            "alias_key": merged.name_key,
            "core_key": merged.core_key,
            "alias": merged.name,
            "source": "merge",
            "created_at": at,
        },
    )
    return int(rows[0].id) if rows else None


def _combined(kept: Any, merged: Any) -> dict[str, Any]:
    """The kept entity's fields after the merge: the earlier first sighting (and its name
    as then seen stays the kept one's), the later last one, a known type over unknown."""
    first = min((kept, merged), key=lambda row: (row.first_turn_id, row.first_position, row.id))
    entity_type = kept.entity_type
    if entity_type == UNKNOWN_TYPE:
        entity_type = merged.entity_type
    return {
        "name": kept.name,
        "entity_type": entity_type,
        "first_seen": min(kept.first_seen, merged.first_seen),
        "last_seen": max(kept.last_seen, merged.last_seen),
        "first_turn_id": first.first_turn_id,
        "first_position": first.first_position,
    }


def unmerge(
    transaction: Transaction, statements: IdentityStatements, logged: Any, *, at: float
) -> None:
    """Undo the merge logged as row ``logged`` of ``entity_merges``."""
    if logged.undone_at is not None:
        raise MergeError(f"merge {logged.id} was undone already")
    record = logged.record
    session = {"session_id": logged.session_id}
    kept = transaction.run(statements.entity_by_id, {**session, "entity_id": logged.kept_entity_id})
    if kept and (kept[0].session_id, kept[0].name_key) != (logged.session_id, record["kept_key"]):
        kept = []  # the id is another entity's now
    if not kept:
        later = transaction.run(
            statements.later_merge_of,
            {"session_id": logged.session_id, "entity_id": logged.kept_entity_id},
        )
        hint = f"undo merge {later[0].id} first" if later else "it was forgotten or pruned"
        raise MergeError(
            f"merge {logged.id} cannot be undone: {logged.kept_name!r} is gone ({hint})"
        )
    merged = record["merged"]
    if transaction.run(statements.entity_by_id, {**session, "entity_id": merged["id"]}):
        raise MergeError(
            f"merge {logged.id} cannot be undone: the id of {merged['name']!r} is taken"
        )
    taken = transaction.run(
        statements.entity_by_key, {"session_id": logged.session_id, "key": merged["name_key"]}
    )
    if taken and logged.reason == KEY_RULES_REASON:
        # The new rules made the two keys one: it comes back held apart.
        held = held_apart_key(merged["id"])
        merged = {**merged, "name_key": held, "core_key": held}
    elif taken:
        raise MergeError(
            f"merge {logged.id} cannot be undone: an entity {taken[0].name!r} has the key of "
            f"{merged['name']!r} now"
        )
    _refuse_alias_of_another(transaction, statements, logged, merged)
    if record["alias_id"] is not None:
        transaction.count(statements.remove_alias, {**session, "alias_id": record["alias_id"]})
    transaction.count(statements.insert_entity, merged)
    back = {**session, "from_id": logged.kept_entity_id, "to_id": merged["id"]}
    kept_snippets = transaction.run(
        statements.contexts_of, {**session, "entity_id": logged.kept_entity_id}
    )
    moved_ids = set(record["moved_contexts"])
    lost_turns = {row.turn_id for row in kept_snippets if row.id in moved_ids} - {None}
    restored = 0
    for context_id in record["moved_contexts"]:
        restored += transaction.count(statements.context_to, {**back, "context_id": context_id})
    for row in record["dropped_contexts"]:
        if row["turn_id"] is None or transaction.run(
            statements.turn_exists, {**session, "turn_id": row["turn_id"]}
        ):
            restored += transaction.count(statements.insert_context, row)
    if not restored and (record["moved_contexts"] or record["dropped_contexts"]):
        # Rolled back whole: an entity with none of its snippets would be an empty name.
        raise MergeError(
            f"merge {logged.id} cannot be undone: nothing of {merged['name']!r} is left (its "
            "snippets were pruned or forgotten since); to stop its name naming "
            f"{logged.kept_name!r}, remove the alias (`zerda-store alias remove`)"
        )
    for alias_id in record["moved_aliases"]:
        transaction.count(statements.alias_to, {**back, "alias_id": alias_id})
    later = transaction.run(
        statements.later_merges_into,
        {**session, "entity_id": logged.kept_entity_id, "merge_id": logged.id},
    )
    after, before = record["kept_after"], record["kept_before"]
    for newer in later:
        after, before = _carry_through(transaction, statements, newer, after, before, lost_turns)
    fields = _restored(kept[0], before, after)
    transaction.count(statements.update_first_last, {**session, "entity_id": kept[0].id, **fields})
    transaction.count(statements.mark_undone, {**session, "merge_id": logged.id, "undone_at": at})


def _refuse_alias_of_another(
    transaction: Transaction, statements: IdentityStatements, logged: Any, merged: dict[str, Any]
) -> None:
    """An unmerge may not bring back an entity whose key is now another entity's alias (its
    alias was removed and given to another since): a name would then be an entity and
    another's alias at once, a state ``add_alias`` refuses and an export cannot carry."""
    values = {"session_id": logged.session_id, "alias_key": merged["name_key"]}
    own = logged.record["alias_id"]
    held = [row for row in transaction.run(statements.alias_by_key, values) if row.id != own]
    if not held:
        return
    values = {"session_id": logged.session_id, "entity_id": held[0].entity_id}
    owner = transaction.run(statements.entity_by_id, values)[0]
    raise MergeError(
        f"merge {logged.id} cannot be undone: {merged['name']!r} is an alias of "
        f"{owner.name!r} now (`zerda-store alias remove` it first)"
    )


def _carry_through(
    transaction: Transaction,
    statements: IdentityStatements,
    newer: Any,
    after: dict[str, Any],
    before: dict[str, Any],
    lost_turns: set[int],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Undo an earlier merge under a newer one into the same kept entity (an unmerge out of
    order): the newer merge's record is made what it would be had the earlier merge never
    been made, and it returns the fields the kept entity had after the newer merge and
    would have had without the earlier one, for the next newer merge or the entity itself.

    The kept entity's fields: those the newer merge found as the earlier one left them take
    the earlier merge's "before" (:func:`_restored`), then combine with the newer merge's
    entity again. Its snippets: one of the newer merge's entity that it dropped because the
    kept entity had a snippet of that turn only through the earlier merge goes to the kept
    entity now (and back with the newer merge's undoing)."""
    record = dict(newer.record)
    session = {"session_id": newer.session_id}
    kept_before = _restored(_Fields(record["kept_before"]), before, after)
    merged = _Fields(record["merged"])
    kept_after = _combined(_Fields({**kept_before, "id": newer.kept_entity_id}), merged)
    dropped, taken = [], []
    for row in record["dropped_contexts"]:
        if row["turn_id"] in lost_turns and transaction.run(
            statements.turn_exists, {**session, "turn_id": row["turn_id"]}
        ):
            transaction.count(statements.insert_context, {**row, "entity_id": newer.kept_entity_id})
            lost_turns.discard(row["turn_id"])
            taken.append(row["id"])
        else:
            dropped.append(row)
    record.update(
        kept_before=kept_before,
        kept_after=kept_after,
        dropped_contexts=dropped,
        moved_contexts=[*record["moved_contexts"], *taken],
    )
    transaction.count(
        statements.update_merge_record, {**session, "merge_id": newer.id, "record": record}
    )
    return newer.record["kept_after"], kept_after


class _Fields:
    """A logged row's fields as attributes (as :func:`_combined` reads entity rows)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)


def _restored(now: Any, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The kept entity's fields as before the merge, but for those changed since (a later
    sighting moves ``last_seen``): those stay as they are now."""
    return {
        field: before[field] if getattr(now, field) == after[field] else getattr(now, field)
        for field in _KEPT_FIELDS
    }
