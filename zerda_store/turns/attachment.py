"""The entities and snippets of saved turns (:class:`Attachment`), and the inserts that
saves, imports and repairs share."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter, ne
from typing import Any

from ..db.execution.unit_of_work import Transaction
from ..identity.resolution import Resolver
from ..model.names import UNKNOWN_TYPE
from ..model.records import MENTION_CORE_KEY, MENTION_KEY, NewTurn
from .rows import context_row, entity_row
from .statements import PreparedInsert, TurnStatements


class Attachment:
    """The entities and snippets of saved turns, prepared for their counts before the
    transaction: one upsert of the turns' entities (one row per key, in key order), then
    one snippet per entity per turn. With a :class:`Resolver`, a mention that names an
    existing entity under another key (an alias, a titled form) joins that entity, so
    fewer rows may be written (their statements compiled beforehand too); ``by_probe``:
    the resolver finds the candidates by a probe per key (not on tables Citus
    distributes)."""

    def __init__(
        self,
        statements: TurnStatements,
        new_turns: Sequence[NewTurn],
        resolver: Resolver | None = None,
        *,
        by_probe: bool = False,
    ) -> None:
        keys = len({mention.key for turn in new_turns for mention in turn.mentions})
        mentions = sum(len(turn.mentions) for turn in new_turns)
        self._resolver = resolver
        self._by_probe = by_probe
        self._statements = statements
        self._counts = (keys, mentions)
        self._entities = statements.entities.prepare(keys) if keys else None
        self._contexts = statements.contexts.prepare(mentions)
        if resolver is not None and keys:
            # Joins write fewer rows than prepared: their statements are compiled now, so
            # that none is compiled inside the transaction (each size once per store).
            statements.entities.compile_all()
            statements.contexts.compile_all()

    def run(
        self,
        transaction: Transaction,
        session_id: str,
        saved: list[tuple[int, NewTurn]],
        *,
        resolution_possible: bool = True,
    ) -> None:
        """Attach the saved turns' entities and snippets. ``resolution_possible`` False:
        the session has no alias and no titled form (``identity.statements``), so that
        mentions that are their own cores keep their keys without a lookup."""
        if self._entities is None:
            return
        mentions = [mention for _, turn in saved for mention in turn.mentions]
        resolving = self._resolver is not None and (
            resolution_possible
            or any(map(ne, map(MENTION_KEY, mentions), map(MENTION_CORE_KEY, mentions)))
        )
        targets = (
            self._resolver.targets(transaction, session_id, mentions, by_probe=self._by_probe)
            if self._resolver is not None and resolving
            else {}
        )
        first: dict[str, dict[str, Any]] = {}
        for turn_id, turn in saved:
            for position, mention in enumerate(turn.mentions):
                target = targets.get(mention.key)
                key = target.key if target else mention.key
                row = first.get(key)
                if row is None:
                    first[key] = entity_row(
                        session_id,
                        name_key=key,
                        core_key=mention.core_key,
                        # A mention that joins an entity never renames it.
                        name=target.name if target else mention.name,
                        entity_type=mention.entity_type,
                        first_seen=turn.created_at,
                        last_seen=turn.created_at,
                        first_turn_id=turn_id,
                        first_position=position,
                    )
                    continue
                row["last_seen"] = max(row["last_seen"], turn.created_at)
                if row["entity_type"] == UNKNOWN_TYPE:
                    row["entity_type"] = mention.entity_type
        rows = list(first.values())
        upsert = self._entities
        if len(rows) != self._counts[0]:
            upsert = self._statements.entities.prepare(len(rows))
        entity_ids = upsert_entities(transaction, upsert, rows)
        if targets:  # a joining mention's snippet goes to the entity it joins
            entity_ids.update({key: entity_ids[target.key] for key, target in targets.items()})
        snippets = {}
        for turn_id, turn in saved:
            text = turn.text
            for mention in turn.mentions:
                entity_id = entity_ids[mention.key]
                snippets[turn_id, entity_id] = context_row(
                    session_id,
                    entity_id=entity_id,
                    turn_id=turn_id,
                    turn_seq=turn_id,
                    text=text,
                    created_at=turn.created_at,
                )
        insert = self._contexts
        if len(snippets) != self._counts[1]:
            insert = self._statements.contexts.prepare(len(snippets))
        insert.run(transaction, list(snippets.values()))
        if targets and self._resolver is not None:
            joined = [(m, entity_ids[m.key]) for m in mentions if m.key in targets]
            self._resolver.record_joins(transaction, session_id, joined, saved[-1][1].created_at)


def upsert_entities(
    transaction: Transaction, upsert: PreparedInsert, rows: Sequence[dict[str, Any]]
) -> dict[str, int]:
    """Insert or update entities, in key order; their ids by key."""
    ordered = sorted(rows, key=_NAME_KEY)
    return {row.name_key: int(row.id) for row in upsert.run(transaction, ordered)}


def insert_turns(
    transaction: Transaction, insert: PreparedInsert, rows: Sequence[dict[str, Any]]
) -> list[int]:
    """Insert turns; their new ids in the order of ``rows``. Ids grow in the order rows are
    inserted within a statement (SQLite AUTOINCREMENT, a Postgres identity), so sorted ids
    line up with the rows whatever order RETURNING gives them in."""
    return sorted(int(row.id) for row in insert.run(transaction, rows))


_NAME_KEY = itemgetter("name_key")
