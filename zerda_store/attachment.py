"""The entities and snippets of saved turns (:class:`Attachment`), and the inserts that
saves, imports and repairs share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .names import UNKNOWN_TYPE
from .records import NewTurn
from .rows import context_row
from .statements import PreparedInsert, TurnStatements
from .unit_of_work import Transaction


class Attachment:
    """The entities and snippets of saved turns, prepared for their counts before the
    transaction: one upsert of the turns' entities (one row per key, in key order), then
    one snippet per mention."""

    def __init__(self, statements: TurnStatements, new_turns: Sequence[NewTurn]) -> None:
        keys = {mention.key for turn in new_turns for mention in turn.mentions}
        mentions = sum(len(turn.mentions) for turn in new_turns)
        self._entities = statements.entities.prepare(len(keys)) if keys else None
        self._contexts = statements.contexts.prepare(mentions)

    def run(
        self, transaction: Transaction, session_id: str, saved: list[tuple[int, NewTurn]]
    ) -> None:
        if self._entities is None:
            return
        first: dict[str, dict[str, Any]] = {}
        for turn_id, turn in saved:
            for position, mention in enumerate(turn.mentions):
                row = first.get(mention.key)
                if row is None:
                    first[mention.key] = {
                        "session_id": session_id,
                        "name_key": mention.key,
                        "name": mention.name,
                        "entity_type": mention.entity_type,
                        "first_seen": turn.created_at,
                        "last_seen": turn.created_at,
                        "first_turn_id": turn_id,
                        "first_position": position,
                    }
                    continue
                row["last_seen"] = max(row["last_seen"], turn.created_at)
                if row["entity_type"] == UNKNOWN_TYPE:
                    row["entity_type"] = mention.entity_type
        entity_ids = upsert_entities(transaction, self._entities, list(first.values()))
        snippets = [
            context_row(
                session_id,
                entity_id=entity_ids[mention.key],
                turn_id=turn_id,
                turn_seq=turn_id,
                text=turn.text,
                created_at=turn.created_at,
            )
            for turn_id, turn in saved
            for mention in turn.mentions
        ]
        self._contexts.run(transaction, snippets)


def upsert_entities(
    transaction: Transaction, upsert: PreparedInsert, rows: Sequence[dict[str, Any]]
) -> dict[str, int]:
    """Insert or update entities, in key order; their ids by key."""
    ordered = sorted(rows, key=lambda row: row["name_key"])
    return {row.name_key: int(row.id) for row in upsert.run(transaction, ordered)}


def insert_turns(
    transaction: Transaction, insert: PreparedInsert, rows: Sequence[dict[str, Any]]
) -> list[int]:
    """Insert turns; their new ids in the order of ``rows``. Ids grow in the order rows are
    inserted within a statement (SQLite AUTOINCREMENT, a Postgres identity), so sorted ids
    line up with the rows whatever order RETURNING gives them in."""
    return sorted(int(row.id) for row in insert.run(transaction, rows))
