"""The operators' queries: session and entity listings, export and import.

Kept apart from :mod:`repository`, which serves the chat turn's hot path; like it, this is
SQL and nothing else.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .engine import StoreError
from .repository import PAGE_SIZE, Repository
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


class AdminRepository(Repository):
    """The repository with the operators' queries added."""

    def sessions(self) -> list[SessionSummary]:
        """Every session that holds turns or entities, by session id."""
        turn_counts = sa.select(
            turns.c.session_id, sa.func.count(), sa.func.max(turns.c.created_at)
        ).group_by(turns.c.session_id)
        entity_counts = sa.select(
            entities.c.session_id, sa.func.count(), sa.func.max(entities.c.last_seen)
        ).group_by(entities.c.session_id)
        with self.store.read() as connection:
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
        with self.store.read() as connection:
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
        with self.store.read() as connection:
            streaming = connection.execution_options(yield_per=PAGE_SIZE)
            for kind, query in (
                ("turn", with_ledger),
                ("entity", in_first_seen_order),
                ("context", snippets),
            ):
                for row in streaming.execute(query):
                    yield {"kind": kind, **row._asdict()}

    def session_exists(self, session_id: str) -> bool:
        with self.store.read() as connection:
            return any(
                connection.execute(
                    sa.select(table.c.id).where(table.c.session_id == session_id).limit(1)
                ).first()
                for table in (turns, entities)
            )

    def import_session(self, session_id: str, records: Sequence[dict[str, Any]]) -> dict[str, int]:
        """Write exported records into a session in one transaction, mapping ids. Entities
        that already exist in the session (a merge) are upserted as a saved turn would be."""
        turn_records = [r for r in records if r["kind"] == "turn"]
        entity_records = [r for r in records if r["kind"] == "entity"]
        context_records = [r for r in records if r["kind"] == "context"]

        def work(connection: Connection) -> dict[str, int]:
            self._refuse_used_idempotency_keys(connection, session_id, turn_records)
            turn_ids = self._import_turns(connection, session_id, turn_records)
            seq = _SequenceMap(turn_ids)
            entity_rows = [
                {
                    "session_id": session_id,
                    "name_key": r["name_key"],
                    "name": r["name"],
                    "entity_type": r["entity_type"],
                    "first_seen": r["first_seen"],
                    "last_seen": r["last_seen"],
                    "first_turn_id": seq.map(r["first_turn_id"]),
                    "first_position": r["first_position"],
                }
                for r in sorted(entity_records, key=lambda r: r["name_key"])
            ]
            driver = self.driver(connection)
            entity_ids = self.upsert_entities(driver, entity_rows)
            by_old_entity = {r["id"]: entity_ids[r["name_key"]] for r in entity_records}
            if context_records:
                self.insert_contexts(
                    driver,
                    [
                        {
                            "session_id": session_id,
                            "entity_id": by_old_entity[r["entity_id"]],
                            "turn_id": turn_ids[r["turn_id"]] if r["turn_id"] is not None else None,
                            "turn_seq": seq.map(r["turn_seq"]),
                            "text": r["text"],
                        }
                        for r in sorted(context_records, key=lambda r: (r["turn_seq"], r["id"]))
                    ],
                )
            return {
                "turns": len(turn_records),
                "entities": len(entity_records),
                "contexts": len(context_records),
            }

        return self.store.run_write(work)

    @staticmethod
    def _refuse_used_idempotency_keys(
        connection: Connection, session_id: str, records: list[dict[str, Any]]
    ) -> None:
        keys = [r["idempotency_key"] for r in records if r["idempotency_key"] is not None]
        if not keys:
            return
        used = connection.execute(
            sa.select(turns.c.idempotency_key)
            .where(turns.c.session_id == session_id, turns.c.idempotency_key.in_(keys))
            .limit(1)
        ).scalar()
        if used is not None:
            raise StoreError(
                f"session {session_id!r} already has a turn with idempotency key {used!r}: "
                "the file was imported before; nothing was imported"
            )

    def _import_turns(
        self, connection: Connection, session_id: str, records: list[dict[str, Any]]
    ) -> dict[int, int]:
        if not records:
            return {}
        records = sorted(records, key=lambda r: r["id"])
        rows = [
            {
                "session_id": session_id,
                "input_text": r["input_text"],
                "output_text": r["output_text"],
                "entity_names": r["entity_names"],
                "created_at": r["created_at"],
                "idempotency_key": r["idempotency_key"],
            }
            for r in records
        ]
        driver = self.driver(connection)
        new_ids = self.insert_turns(driver, rows)
        outcomes = [
            {
                "session_id": session_id,
                "turn_id": new_id,
                "extractor": r["extractor"] or "unknown",
                "status": r["status"] or "ok",
                "error": r["error"],
                "latency_ms": r["latency_ms"] or 0.0,
                "entity_count": r["entity_count"] if r["entity_count"] is not None else 0,
                "attempts": r["attempts"] or 1,
                "updated_at": r["updated_at"] if r["updated_at"] is not None else r["created_at"],
            }
            for r, new_id in zip(records, new_ids, strict=True)
        ]
        self.insert_outcomes(driver, outcomes)
        return {r["id"]: new_id for r, new_id in zip(records, new_ids, strict=True)}


class _SequenceMap:
    """Maps the source's turn sequence numbers onto the imported turns' new ids, keeping
    their order: a number maps to the new id of the newest imported turn at or before it."""

    def __init__(self, turn_ids: dict[int, int]) -> None:
        self._old = sorted(turn_ids)
        self._new = [turn_ids[old] for old in self._old]

    def map(self, old_seq: int) -> int:
        index = bisect.bisect_right(self._old, old_seq) - 1
        return self._new[index] if index >= 0 else 0
