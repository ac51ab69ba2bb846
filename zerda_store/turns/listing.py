"""The operators' listings of sessions and entities (``zerda-store sessions``,
``entities``), showing what a memory's reads show: under a retention policy, what it has
expired is left out (the same :class:`Visibility` and the same visible counts as the
reads, at the moment of the listing), and a session of which nothing shows is not listed.
Ad-hoc reads through SQLAlchemy (:meth:`Store.query`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..db.schema import contexts, entities, in_same_session, listed_first_seen, turns
from ..db.store import StoreCore
from ..retention.policies import Policies
from ..retention.policy import Clock
from .reads import Reads


@dataclass(frozen=True)
class SessionSummary:
    session_id: str
    entity_count: int
    message_count: int
    last_activity: float | None


@dataclass(frozen=True)
class EntitySummary:
    name: str
    entity_type: str
    contexts_count: int
    first_seen: float
    last_seen: float


class Listings:
    """The listings of one store, as its memories' reads would show them at ``now``."""

    def __init__(self, store: StoreCore, now: Clock = time.time) -> None:
        self.store = store
        self._now = now
        self._policies = Policies(store)
        self._reads = Reads(store)

    def session_ids(self) -> list[str]:
        """Every session that holds turns or entities, shown or not, by session id."""
        by_turns, by_entities = self._counts()
        return sorted(by_turns.keys() | by_entities.keys())

    def _counts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Each session's turns and entities: its id, how many, and the newest time."""
        turn_counts = sa.select(
            turns.c.session_id, sa.func.count(), sa.func.max(turns.c.created_at)
        ).group_by(turns.c.session_id)
        entity_counts = sa.select(
            entities.c.session_id, sa.func.count(), sa.func.max(entities.c.last_seen)
        ).group_by(entities.c.session_id)
        with self.store.query() as connection:
            by_turns = {row[0]: row for row in connection.execute(turn_counts)}
            by_entities = {row[0]: row for row in connection.execute(entity_counts)}
        return by_turns, by_entities

    def sessions(self, *, include_expired: bool = False) -> list[SessionSummary]:
        """Every session that holds turns or entities that show, by session id
        (``include_expired``: every session that holds any, with the counts stored)."""
        by_turns, by_entities = self._counts()
        limited = not include_expired and self._policies.any_rules()
        summaries = []
        for session_id in sorted(by_turns.keys() | by_entities.keys()):
            turn_row, entity_row = by_turns.get(session_id), by_entities.get(session_id)
            activity = [row[2] for row in (turn_row, entity_row) if row is not None]
            counts = (entity_row[1] if entity_row else 0, turn_row[1] if turn_row else 0)
            visible = self._policies.visibility_now(session_id, self._now()) if limited else None
            if visible is not None:
                stats = self._reads.stats(session_id, visible)
                counts = (stats.entity_count, stats.message_count)
                if counts == (0, 0):
                    continue
            summaries.append(SessionSummary(session_id, *counts, max(activity)))
        return summaries

    def entity_summaries(self, session_id: str) -> list[EntitySummary]:
        """The session's entities that show, with their snippet counts, in first-seen
        order."""
        counts = (
            sa.select(contexts.c.session_id, contexts.c.entity_id, sa.func.count().label("n"))
            .where(contexts.c.session_id == session_id)
            .group_by(contexts.c.session_id, contexts.c.entity_id)
            .subquery()
        )
        query = (
            sa.select(
                entities.c.id,
                entities.c.name,
                entities.c.entity_type,
                sa.func.coalesce(counts.c.n, 0),
                entities.c.first_seen,
                entities.c.last_seen,
            )
            .outerjoin(counts, in_same_session(counts.c.entity_id, entities.c.id))
            .where(entities.c.session_id == session_id, listed_first_seen())
            .order_by(entities.c.first_turn_id, entities.c.first_position, entities.c.id)
        )
        visible = self._policies.visibility_now(session_id, self._now())
        shown = None if visible is None else self._reads.snippet_counts(session_id, visible)
        with self.store.query() as connection:
            rows = list(connection.execute(query))
        if shown is None:
            return [EntitySummary(*row[1:]) for row in rows]
        return [
            EntitySummary(name, kind, shown[id_], first, last)
            for id_, name, kind, _, first, last in rows
            if id_ in shown
        ]
