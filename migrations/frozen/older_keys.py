"""Revision 0006's downgrade, frozen: give the older release what it needs to find its data.

The older release knows neither aliases, nor merges, nor fold-v2: it finds an entity by the
fold-v1 key of a name (``normalize_names=True``) or by the name itself (``False``). So the
downgrade undoes every merge the upgrade made (reason "key rules", not undone yet), newest
first, and gives every entity of a session that is not exact the fold-v1 key of its name.
Where that cannot be done it refuses, changing nothing, and says what to do: a key-rules
merge whose kept entity was merged into another since, or two entities that fold-v1 cannot
tell apart ("Bill" and "bill", apart under fold-v2).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa

from .fold_rules import fold_v1
from .rekeying import (
    CONTEXTS,
    ENTITIES,
    KEPT_FIELDS,
    KEY_RULES_REASON,
    MERGES,
    PARKED,
    RULES,
    TURNS,
    set_keys,
)


class DowngradeRefusedError(ValueError):
    """The older release could not find this database's data: nothing was changed."""


def restore_older_keys(connection: sa.Connection, now: float) -> int:
    """Undo the upgrade's merges and give the entities the keys the older release makes;
    returns how many merges were undone."""
    pending = connection.execute(
        sa.select(MERGES)
        .where(MERGES.c.reason == KEY_RULES_REASON, MERGES.c.undone_at.is_(None))
        .order_by(MERGES.c.id.desc())
    ).all()
    for logged in pending:
        _unmerge(connection, logged, now)
    _fold_v1_keys(connection)
    return len(pending)


def _unmerge(connection: sa.Connection, logged: Any, now: float) -> None:
    record = logged.record
    kept = connection.execute(
        sa.select(ENTITIES).where(
            ENTITIES.c.id == logged.kept_entity_id, ENTITIES.c.session_id == logged.session_id
        )
    ).first()
    if kept is None:
        raise DowngradeRefusedError(
            f"cannot downgrade: merge {logged.id} of session {logged.session_id!r} (key rules) "
            f"cannot be undone, {logged.kept_name!r} is gone or merged into another entity: "
            f"undo the merges of {logged.kept_name!r} (`zerda-store merges --session "
            f"{logged.session_id}`, then `zerda-store unmerge ID`) and downgrade again"
        )
    merged = dict(record["merged"])
    # Parked until every key of the session is set: its old key may be the kept one's now.
    merged["name_key"] = f"{PARKED}{merged['id']}"
    connection.execute(ENTITIES.insert().values(**merged))
    moved = record["moved_contexts"]
    if moved:
        connection.execute(
            CONTEXTS.update()
            .where(CONTEXTS.c.id.in_(moved), CONTEXTS.c.entity_id == kept.id)
            .values(entity_id=merged["id"])
        )
    for row in record["dropped_contexts"]:
        if (
            row["turn_id"] is None
            or connection.execute(sa.select(TURNS.c.id).where(TURNS.c.id == row["turn_id"])).first()
        ):
            connection.execute(CONTEXTS.insert().values(**row))
    before, after = record["kept_before"], record["kept_after"]
    restored = {
        name: before[name] if getattr(kept, name) == after[name] else getattr(kept, name)
        for name in KEPT_FIELDS
    }
    connection.execute(ENTITIES.update().where(ENTITIES.c.id == kept.id).values(**restored))
    connection.execute(MERGES.update().where(MERGES.c.id == logged.id).values(undone_at=now))


def _fold_v1_keys(connection: sa.Connection) -> None:
    """Every entity of a session not recorded as exact takes the fold-v1 key of its name."""
    exact = sa.select(RULES.c.session_id).where(RULES.c.key_rules == "exact")
    rows = connection.execute(
        sa.select(ENTITIES.c.id, ENTITIES.c.session_id, ENTITIES.c.name, ENTITIES.c.name_key)
        .where(ENTITIES.c.session_id.not_in(exact))
        .order_by(ENTITIES.c.session_id, ENTITIES.c.id)
    ).all()
    holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        holders[(row.session_id, fold_v1(row.name))].append(row.name)
    clashes = [(session, names) for (session, _), names in holders.items() if len(names) > 1]
    if clashes:
        session, names = clashes[0]
        raise DowngradeRefusedError(
            f"cannot downgrade: the older release cannot tell {' and '.join(map(repr, names))} "
            f"of session {session!r} apart ({len(clashes)} such groups): merge or forget one "
            f"(`zerda-store merge ... --session {session}`) and downgrade again"
        )
    changed = [
        (row.id, fold_v1(row.name), fold_v1(row.name))
        for row in rows
        if row.name_key != fold_v1(row.name)
    ]
    set_keys(connection, changed)
