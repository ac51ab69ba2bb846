"""Revision 0006's data work, frozen: which key rules each session was written with, the
re-keying of fold-v1 sessions with fold-v2 (merging what collides, through the merge log),
and on downgrade what the older release needs to find its data again.

Written against the tables as 0006 leaves them, in SQLAlchemy Core on the migration's own
connection; nothing of the library is imported, so that this keeps doing what it did however
the library's modules move. The merge log's ``record`` is the library's format
(``unmerge`` reads it): keep it as it is.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from .evidence import EXACT, FOLD_V1, UNSURE, written_with
from .fold_rules import fold_v2_identity

FOLD_V2 = "fold-v2"
KEY_RULES_REASON = "key rules"
UNKNOWN_TYPE = "unknown"
# A key no rule makes (control characters are never in a name): where a key waits while
# the keys of its session are changed, so that no two entities share one in between.
PARKED = "\x01rekey "

ENTITY_COLUMNS = (
    "id", "session_id", "name_key", "core_key", "name", "entity_type",
    "first_seen", "last_seen", "first_turn_id", "first_position",
)  # fmt: skip
CONTEXT_COLUMNS = ("id", "session_id", "entity_id", "turn_id", "turn_seq", "text", "created_at")
KEPT_FIELDS = ("name", "entity_type", "first_seen", "last_seen", "first_turn_id", "first_position")

ENTITIES = sa.table("entities", *(sa.column(name) for name in ENTITY_COLUMNS))
CONTEXTS = sa.table("contexts", *(sa.column(name) for name in CONTEXT_COLUMNS))
TURNS = sa.table("turns", sa.column("id"), sa.column("session_id"),
                 sa.column("entity_names", sa.JSON()))  # fmt: skip
RULES = sa.table("session_key_rules", sa.column("session_id"), sa.column("key_rules"),
                 sa.column("created_at"))  # fmt: skip
MERGES = sa.table(
    "entity_merges",
    *(sa.column(name) for name in ("id", "session_id", "kept_entity_id", "merged_entity_id",
                                   "kept_name", "merged_name", "reason", "created_at",
                                   "undone_at")),
    sa.column("record", sa.JSON()),
)  # fmt: skip


@dataclass
class SessionOutcome:
    """What the upgrade did to one session: the rules recorded (None: the session's keys
    are the same under every rule, and its next save records the rules of its memory),
    whether they were a guess kept on the safe side, and the merges made."""

    session_id: str
    key_rules: str | None
    unsure: bool = False
    rekeyed: int = 0
    merges: list[dict[str, Any]] = field(default_factory=list)


# -- upgrade ------------------------------------------------------------------------------


def rekey_sessions(
    connection: sa.Connection, now: float, *, assume_normalized: bool | Collection[str] = False
) -> list[SessionOutcome]:
    """Record each session's key rules and re-key the fold-v1 ones with fold-v2;
    ``assume_normalized``: the unsure sessions (True: all) the operator knows were fold-v1."""
    sessions = connection.execute(sa.select(ENTITIES.c.session_id).distinct()).scalars().all()
    return [
        rekey_session(connection, session_id, now, assume_normalized=assume_normalized)
        for session_id in sorted(sessions)
    ]


def pending_sessions(connection: sa.Connection) -> list[str]:
    """The sessions holding entities that no re-keying has given a core yet (``NULL``: the
    column was added since; the previous release's saves take the column's default)."""
    query = sa.select(ENTITIES.c.session_id).where(ENTITIES.c.core_key.is_(None)).distinct()
    return sorted(connection.execute(query).scalars())


def rekey_session(
    connection: sa.Connection,
    session_id: str,
    now: float,
    *,
    assume_normalized: bool | Collection[str] = False,
) -> SessionOutcome:
    """Record one session's key rules and re-key it if it was written with fold-v1."""
    assumed = assume_normalized is True or (
        not isinstance(assume_normalized, bool) and session_id in assume_normalized
    )
    return _rekey_session(connection, session_id, now, assumed)


def _entities(connection: sa.Connection, session_id: str) -> list[dict[str, Any]]:
    query = (
        sa.select(ENTITIES)
        .where(ENTITIES.c.session_id == session_id)
        .order_by(ENTITIES.c.first_turn_id, ENTITIES.c.first_position, ENTITIES.c.id)
    )
    return [dict(row._mapping) for row in connection.execute(query)]


def _turn_names(connection: sa.Connection, session_id: str) -> Iterable[Sequence[str]]:
    query = sa.select(TURNS.c.entity_names).where(TURNS.c.session_id == session_id)
    return (names for names in connection.execute(query).scalars() if names)


def _lock_entities(connection: sa.Connection, session_id: str) -> None:
    """Lock the session's entities, in key order as saves upsert them (no deadlock with
    one). A save of the previous release (which takes no session lock) that upserted one of
    them has committed before this returns, so its snippet is read and moved with the
    rest; one that comes later waits for the commit, then finds the entity under its new key
    or (merged away) makes a new one, which `db rekey` re-keys: none is deleted with a
    merged entity. SQLite has one writer at a time: nothing to lock there."""
    query = (
        sa.select(ENTITIES.c.id)
        .where(ENTITIES.c.session_id == session_id)
        .order_by(ENTITIES.c.name_key)
        .with_for_update()
    )
    connection.execute(query).all()


def _rekey_session(
    connection: sa.Connection, session_id: str, now: float, assume_normalized: bool
) -> SessionOutcome:
    _lock_entities(connection, session_id)
    rows = _entities(connection, session_id)
    found = written_with(rows, _turn_names(connection, session_id))
    if found == UNSURE and assume_normalized:
        found = FOLD_V1
    if found == UNSURE and all(fold_v2_identity(row["name"]) == (row["name"],) * 2 for row in rows):
        # Every key is its name under both rules: the next save's memory decides.
        _set_cores(connection, rows)
        return SessionOutcome(session_id, None)
    if found in (EXACT, UNSURE):
        _record(connection, session_id, EXACT, now)
        _set_cores(connection, rows)
        return SessionOutcome(session_id, EXACT, unsure=found == UNSURE)
    assert found == FOLD_V1
    _record(connection, session_id, FOLD_V2, now)
    return _to_fold_v2(connection, session_id, rows, now)


def _record(connection: sa.Connection, session_id: str, rules: str, now: float) -> None:
    values = {"session_id": session_id, "key_rules": rules, "created_at": now}
    connection.execute(RULES.insert().values(**values))


def _set_cores(connection: sa.Connection, rows: list[dict[str, Any]]) -> None:
    """Exact keys have no core apart: the core is the key."""
    if rows:
        ids = [row["id"] for row in rows]
        connection.execute(
            ENTITIES.update().where(ENTITIES.c.id.in_(ids)).values(core_key=ENTITIES.c.name_key)
        )


def _to_fold_v2(
    connection: sa.Connection, session_id: str, rows: list[dict[str, Any]], now: float
) -> SessionOutcome:
    outcome = SessionOutcome(session_id, FOLD_V2)
    keepers: dict[str, dict[str, Any]] = {}
    for row in rows:
        key, core = fold_v2_identity(row["name"])
        keeper = keepers.get(key)
        if keeper is None:
            keepers[key] = {**row, "name_key": key, "core_key": core}
            continue
        merged = {**row, "core_key": core}
        outcome.merges.append(merge(connection, keeper, merged, now))
    stored = {row["id"]: (row["name_key"], row["core_key"]) for row in rows}
    changed = [
        row for row in keepers.values() if (row["name_key"], row["core_key"]) != stored[row["id"]]
    ]
    set_keys(connection, [(row["id"], row["name_key"], row["core_key"]) for row in changed])
    outcome.rekeyed = len(changed)
    return outcome


def set_keys(connection: sa.Connection, keys: list[tuple[int, str, str]]) -> None:
    """Give entities new keys: parked first, so that no two share a key in between."""
    by_id = ENTITIES.c.id == sa.bindparam("entity_id")
    update = (
        ENTITIES.update()
        .where(by_id)
        .values(name_key=sa.bindparam("name_key"), core_key=sa.bindparam("core_key"))
    )
    if keys:
        parked = [{"entity_id": id_, "name_key": f"{PARKED}{id_}", "core_key": core}
                  for id_, _, core in keys]  # fmt: skip
        connection.execute(update, parked)
        final = [{"entity_id": id_, "name_key": key, "core_key": core} for id_, key, core in keys]
        connection.execute(update, final)


def merge(
    connection: sa.Connection, kept: dict[str, Any], merged: dict[str, Any], now: float
) -> dict[str, Any]:
    """Merge entity ``merged`` into ``kept`` (the kept one's new key in ``kept``) as the
    library's merge does, without an alias, logged with the reason "key rules"; ``kept``
    takes the combined fields. Returns the log entry's id and names."""
    kept_turns = set(
        connection.execute(
            sa.select(CONTEXTS.c.turn_id).where(
                CONTEXTS.c.entity_id == kept["id"], CONTEXTS.c.turn_id.is_not(None)
            )
        ).scalars()
    )
    own = connection.execute(
        sa.select(CONTEXTS).where(CONTEXTS.c.entity_id == merged["id"]).order_by(CONTEXTS.c.id)
    )
    own_rows = [dict(row._mapping) for row in own]
    dropped = [row for row in own_rows if row["turn_id"] in kept_turns]
    dropped_ids = {row["id"] for row in dropped}
    if dropped_ids:
        connection.execute(CONTEXTS.delete().where(CONTEXTS.c.id.in_(dropped_ids)))
    connection.execute(
        CONTEXTS.update().where(CONTEXTS.c.entity_id == merged["id"]).values(entity_id=kept["id"])
    )
    connection.execute(ENTITIES.delete().where(ENTITIES.c.id == merged["id"]))
    before = {name: kept[name] for name in KEPT_FIELDS}
    after = _combined(kept, merged)
    connection.execute(ENTITIES.update().where(ENTITIES.c.id == kept["id"]).values(**after))
    kept.update(after)
    record = {
        "kept_key": kept["name_key"],
        "merged": {name: merged[name] for name in ENTITY_COLUMNS},
        "kept_before": before,
        "kept_after": after,
        "moved_contexts": [row["id"] for row in own_rows if row["id"] not in dropped_ids],
        "dropped_contexts": dropped,
        "moved_aliases": [],
        "alias_id": None,
    }
    entry = {
        "session_id": kept["session_id"],
        "kept_entity_id": kept["id"],
        "merged_entity_id": merged["id"],
        "kept_name": kept["name"],
        "merged_name": merged["name"],
        "reason": KEY_RULES_REASON,
        "record": record,
        "created_at": now,
    }
    merge_id = connection.execute(MERGES.insert().values(**entry).returning(MERGES.c.id)).scalar()
    return {"merge_id": int(merge_id or 0), "kept": kept["name"], "merged": merged["name"]}


def _combined(kept: dict[str, Any], merged: dict[str, Any]) -> dict[str, Any]:
    """The earlier first sighting, the later last one, a known type over unknown."""
    order = ("first_turn_id", "first_position", "id")
    first = min((kept, merged), key=lambda row: tuple(row[name] for name in order))
    entity_type = kept["entity_type"]
    if entity_type == UNKNOWN_TYPE:
        entity_type = merged["entity_type"]
    return {
        "name": kept["name"],
        "entity_type": entity_type,
        "first_seen": min(kept["first_seen"], merged["first_seen"]),
        "last_seen": max(kept["last_seen"], merged["last_seen"]),
        "first_turn_id": first["first_turn_id"],
        "first_position": first["first_position"],
    }
