"""Importing exported records into a session: one unit of work that holds the session's
lock exclusively, so that its refuse-if-not-empty check and its writes cannot be raced by
another import, a copy or a save.

Rows are built by the same builders as a save's (:mod:`rows`); a turn whose idempotency
key the session has used is found by the insert itself (``ON CONFLICT DO NOTHING``), not by
a list of keys, so no parameter limit applies however many turns the file holds.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from .driver import compile_statement
from .engine import Store
from .errors import SessionNotEmptyError, StoreError
from .queries import session_param
from .repository import upsert_entities
from .rows import context_row, entity_row, outcome_row, turn_row
from .schema import entities, turns
from .statements import RowsInsert, TurnStatements
from .unit_of_work import SessionLock, Transaction


def _insert_unless_key_used(insert: Any) -> Any:
    return insert.on_conflict_do_nothing(
        index_elements=[turns.c.session_id, turns.c.idempotency_key]
    ).returning(turns.c.id, turns.c.idempotency_key)


class ImportStatements:
    def __init__(self, dialect: Dialect) -> None:
        def holds(table: sa.Table) -> Any:
            return sa.exists().where(table.c.session_id == session_param())

        self.session_exists = compile_statement(
            sa.select(sa.or_(holds(turns), holds(entities)).label("found")), dialect
        )
        self.turns = RowsInsert(dialect, turns, _insert_unless_key_used)


class Importer:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._statements = store.statements(ImportStatements)
        self._turn_statements = store.statements(TurnStatements)

    def session_exists(self, session_id: str) -> bool:
        values = {"session_id": session_id}
        rows = self.store.read(lambda t: t.run(self._statements.session_exists, values))
        return bool(rows[0].found)

    def import_session(
        self, session_id: str, records: Sequence[dict[str, Any]], *, merge: bool = False
    ) -> dict[str, int]:
        """Write exported records into a session in one transaction, mapping ids. Entities
        that already exist in the session (a merge) are upserted as a saved turn would be.
        Nothing is written if the session holds data and ``merge`` is false, or if a turn's
        idempotency key was used in the session before."""
        turn_records = sorted((r for r in records if r["kind"] == "turn"), key=lambda r: r["id"])
        entity_records = [r for r in records if r["kind"] == "entity"]
        context_records = [r for r in records if r["kind"] == "context"]
        insert_turn_rows = self._statements.turns.prepare(len(turn_records))
        upsert = self._turn_statements.entities.prepare(len(entity_records))
        insert_contexts = self._turn_statements.contexts.prepare(len(context_records))
        insert_outcomes = self._turn_statements.outcomes.prepare(len(turn_records))

        def work(transaction: Transaction) -> dict[str, int]:
            if (
                not merge
                and transaction.run(self._statements.session_exists, {"session_id": session_id})[
                    0
                ].found
            ):
                raise SessionNotEmptyError(
                    f"session {session_id!r} already holds data: pass --merge to add to it"
                )
            turn_ids = self._import_turns(transaction, insert_turn_rows, session_id, turn_records)
            outcomes = [_outcome_row(session_id, turn_ids[r["id"]], r) for r in turn_records]
            insert_outcomes.run(transaction, outcomes)
            seq = _SequenceMap(turn_ids)
            rows = [_entity_row(session_id, seq, r) for r in entity_records]
            entity_ids = upsert_entities(transaction, upsert, rows) if rows else {}
            by_old_entity = {r["id"]: entity_ids[r["name_key"]] for r in entity_records}
            ordered = sorted(context_records, key=lambda r: (r["turn_seq"], r["id"]))
            insert_contexts.run(
                transaction,
                [
                    context_row(
                        session_id,
                        entity_id=by_old_entity[r["entity_id"]],
                        turn_id=turn_ids[r["turn_id"]] if r["turn_id"] is not None else None,
                        turn_seq=seq.map(r["turn_seq"]),
                        text=r["text"],
                    )
                    for r in ordered
                ],
            )
            return {
                "turns": len(turn_records),
                "entities": len(entity_records),
                "contexts": len(context_records),
            }

        return self.store.write(work, SessionLock(session_id, exclusive=True))

    @staticmethod
    def _import_turns(
        transaction: Transaction, insert: Any, session_id: str, records: list[dict[str, Any]]
    ) -> dict[int, int]:
        if not records:
            return {}
        rows = [
            turn_row(
                session_id,
                input_text=r["input_text"],
                output_text=r["output_text"],
                entity_names=r["entity_names"],
                created_at=r["created_at"],
                idempotency_key=r["idempotency_key"],
            )
            for r in records
        ]
        inserted = insert.run(transaction, rows)
        if len(inserted) < len(rows):
            stored = {row.idempotency_key for row in inserted}
            used = next(r["idempotency_key"] for r in records if r["idempotency_key"] not in stored)
            raise StoreError(
                f"session {session_id!r} already has a turn with idempotency key {used!r}: "
                "the file was imported before; nothing was imported"
            )
        # Ids grow in insertion order (see repository.insert_turns).
        new_ids = sorted(int(row.id) for row in inserted)
        return {r["id"]: new_id for r, new_id in zip(records, new_ids, strict=True)}


def _outcome_row(session_id: str, turn_id: int, r: dict[str, Any]) -> dict[str, Any]:
    return outcome_row(
        session_id,
        turn_id=turn_id,
        extractor=r["extractor"] or "unknown",
        status=r["status"] or "ok",
        error=r["error"],
        latency_ms=r["latency_ms"] or 0.0,
        entity_count=r["entity_count"] if r["entity_count"] is not None else 0,
        attempts=r["attempts"] or 1,
        updated_at=r["updated_at"] if r["updated_at"] is not None else r["created_at"],
    )


def _entity_row(session_id: str, seq: _SequenceMap, r: dict[str, Any]) -> dict[str, Any]:
    return entity_row(
        session_id,
        name_key=r["name_key"],
        name=r["name"],
        entity_type=r["entity_type"],
        first_seen=r["first_seen"],
        last_seen=r["last_seen"],
        first_turn_id=seq.map(r["first_turn_id"]),
        first_position=r["first_position"],
    )


class _SequenceMap:
    """Maps the source's turn sequence numbers onto the imported turns' new ids, keeping
    their order: a number maps to the new id of the newest imported turn at or before it."""

    def __init__(self, turn_ids: dict[int, int]) -> None:
        self._old = sorted(turn_ids)
        self._new = [turn_ids[old] for old in self._old]

    def map(self, old_seq: int) -> int:
        index = bisect.bisect_right(self._old, old_seq) - 1
        return self._new[index] if index >= 0 else 0
