"""The operators' queries: session and entity listings, export, import and copy.

Kept apart from :mod:`repository`, which serves the chat turn's hot path. Listings and
exports are ad-hoc reads and go through SQLAlchemy (:meth:`Store.query`); imports are one
unit of work holding the session's lock exclusively, with their refuse-if-not-empty check
inside it (:mod:`importing`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from .engine import Store
from .errors import SessionNotEmptyError
from .importing import Importer
from .ledger import Ledger
from .records import PendingTurn
from .repository import PAGE_SIZE
from .schema import contexts, entities, extractions, turns


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


@dataclass(frozen=True)
class CopyReport:
    copied: int
    skipped: int


class AdminRepository:
    """The operators' queries over one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._importer = Importer(store)

    def sessions(self) -> list[SessionSummary]:
        """Every session that holds turns or entities, by session id."""
        turn_counts = sa.select(
            turns.c.session_id, sa.func.count(), sa.func.max(turns.c.created_at)
        ).group_by(turns.c.session_id)
        entity_counts = sa.select(
            entities.c.session_id, sa.func.count(), sa.func.max(entities.c.last_seen)
        ).group_by(entities.c.session_id)
        with self.store.query() as connection:
            by_turns = {row[0]: row for row in connection.execute(turn_counts)}
            by_entities = {row[0]: row for row in connection.execute(entity_counts)}
        summaries = []
        for session_id in sorted(by_turns.keys() | by_entities.keys()):
            turn_row, entity_row = by_turns.get(session_id), by_entities.get(session_id)
            activity = [row[2] for row in (turn_row, entity_row) if row is not None]
            summaries.append(
                SessionSummary(
                    session_id,
                    entity_row[1] if entity_row else 0,
                    turn_row[1] if turn_row else 0,
                    max(activity) if activity else None,
                )
            )
        return summaries

    def entity_summaries(self, session_id: str) -> list[EntitySummary]:
        """The session's entities with their snippet counts, in first-seen order."""
        counts = (
            sa.select(contexts.c.entity_id, sa.func.count().label("n"))
            .where(contexts.c.session_id == session_id)
            .group_by(contexts.c.entity_id)
            .subquery()
        )
        query = (
            sa.select(
                entities.c.name,
                entities.c.entity_type,
                sa.func.coalesce(counts.c.n, 0),
                entities.c.first_seen,
                entities.c.last_seen,
            )
            .outerjoin(counts, counts.c.entity_id == entities.c.id)
            .where(entities.c.session_id == session_id)
            .order_by(entities.c.first_turn_id, entities.c.first_position, entities.c.id)
        )
        with self.store.query() as connection:
            return [EntitySummary(*row) for row in connection.execute(query)]

    def export_session(self, session_id: str) -> Iterator[dict[str, Any]]:
        """Every row of a session as plain records, from one snapshot: turns with their
        ledger rows, entities in first-seen order, then snippets in each entity's order.
        Ids are the source database's and serve only as references between records."""
        with_ledger = (
            sa.select(
                turns.c.id,
                turns.c.input_text,
                turns.c.output_text,
                turns.c.entity_names,
                turns.c.created_at,
                turns.c.idempotency_key,
                extractions.c.extractor,
                extractions.c.status,
                extractions.c.error,
                extractions.c.latency_ms,
                extractions.c.entity_count,
                extractions.c.attempts,
                extractions.c.updated_at,
            )
            .outerjoin(extractions, extractions.c.turn_id == turns.c.id)
            .where(turns.c.session_id == session_id)
            .order_by(turns.c.id)
        )
        in_first_seen_order = (
            sa.select(*(c for c in entities.c if c.name != "session_id"))
            .where(entities.c.session_id == session_id)
            .order_by(entities.c.first_turn_id, entities.c.first_position, entities.c.id)
        )
        snippets = (
            sa.select(
                contexts.c.id,
                contexts.c.entity_id,
                contexts.c.turn_id,
                contexts.c.turn_seq,
                contexts.c.text,
            )
            .join(entities, entities.c.id == contexts.c.entity_id)
            .where(contexts.c.session_id == session_id)
            .order_by(
                entities.c.first_turn_id,
                entities.c.first_position,
                entities.c.id,
                contexts.c.turn_seq,
                contexts.c.id,
            )
        )
        with self.store.query() as connection:
            streaming = connection.execution_options(yield_per=PAGE_SIZE)
            for kind, query in (
                ("turn", with_ledger),
                ("entity", in_first_seen_order),
                ("context", snippets),
            ):
                for row in streaming.execute(query):
                    yield {"kind": kind, **row._asdict()}

    def session_exists(self, session_id: str) -> bool:
        return self._importer.session_exists(session_id)

    def failed_turns(self, session_id: str | None = None) -> list[PendingTurn]:
        """Turns whose extraction failed (of one session, or of all)."""
        return Ledger(self.store).failed_turns(session_id)

    def import_session(
        self, session_id: str, records: Iterable[dict[str, Any]], *, merge: bool = False
    ) -> dict[str, int]:
        """Write exported records into a session in one transaction (see
        :meth:`Importer.import_session`); without ``merge`` a session that holds data is
        refused with :class:`SessionNotEmptyError`."""
        return self._importer.import_session(session_id, records, merge=merge)

    def copy_to(
        self,
        target: Store,
        session_ids: Iterable[str] | None = None,
        progress: Callable[[Iterable[str]], Iterable[str]] = lambda ids: ids,
    ) -> CopyReport:
        """Copy sessions (default: all) into ``target``, each in one transaction. Sessions
        that already hold data there are skipped, so an interrupted copy can be run again,
        and two copies running at once store each session once."""
        ids = (
            list(session_ids)
            if session_ids is not None
            else [s.session_id for s in self.sessions()]
        )
        destination = AdminRepository(target)
        copied = skipped = 0
        for session_id in progress(ids):
            try:
                destination.import_session(session_id, _Export(self, session_id))
            except SessionNotEmptyError:
                skipped += 1
                continue
            copied += 1
        return CopyReport(copied, skipped)


class _Export:
    """A session's records as an export gives them, streamed again on every iteration."""

    def __init__(self, source: AdminRepository, session_id: str) -> None:
        self._source = source
        self._session_id = session_id

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._source.export_session(self._session_id)
