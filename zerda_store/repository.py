"""The memory's repository: saving turns and reading them back. It speaks in plain values
and small records; its SQL is built in :mod:`statements` and :mod:`queries` and compiled
once per store.

Every write is one unit of work (:meth:`Store.write`) whose statements are compiled
before it begins; a save takes its session's lock shared, so that erasure, clear and
import (which take it exclusively, :mod:`erasure`, :mod:`admin`) see every save committed
before them. Entity upserts take their keys in sorted order so that two turns naming the
same entities cannot deadlock each other.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .attachment import Attachment, insert_turns, upsert_entities
from .engine import Store
from .records import EntityRecord, NewTurn, SessionStats
from .retention import Visibility
from .rows import entity_record, new_outcome_row, new_turn_row
from .statements import TurnStatements
from .turn_history import PAGE_SIZE, TurnHistory
from .unit_of_work import SessionLock, Transaction

__all__ = ["PAGE_SIZE", "Attachment", "Repository", "insert_turns", "recalled", "upsert_entities"]

T = TypeVar("T")


class Repository(TurnHistory):
    """Saves and reads of one store's memories (one per memory; the statements are the
    store's)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._statements = store.statements(TurnStatements)

    # -- writes -------------------------------------------------------------------------

    def save_turn(self, session_id: str, turn: NewTurn) -> int | None:
        """Store one turn with its entities and snippets; None if its idempotency key was
        already used in this session."""
        return self.store.write(*self.save_turn_work(session_id, turn))

    def save_turn_work(
        self, session_id: str, turn: NewTurn
    ) -> tuple[Callable[[Transaction], int | None], SessionLock]:
        """The unit of work of one saved turn, its statements prepared, and its lock
        (:meth:`save_turn`, and the async path's)."""
        insert_turn = self._statements.turn.prepare(1)
        attachment = Attachment(self._statements, [turn])
        insert_outcome = self._statements.outcomes.prepare(1)
        turn_row = new_turn_row(session_id, turn)

        def work(transaction: Transaction) -> int | None:
            inserted = insert_turn.run(transaction, [turn_row])
            if not inserted:
                return None
            turn_id = int(inserted[0].id)
            attachment.run(transaction, session_id, [(turn_id, turn)])
            insert_outcome.run(transaction, [new_outcome_row(session_id, turn_id, turn)])
            return turn_id

        return work, SessionLock(session_id)

    def save_turns(self, session_id: str, new_turns: Sequence[NewTurn]) -> list[int]:
        """Store many turns in one transaction, as a loop of :meth:`save_turn` would."""
        if not new_turns:
            return []
        insert = self._statements.turns.prepare(len(new_turns))
        attachment = Attachment(self._statements, new_turns)
        insert_outcomes = self._statements.outcomes.prepare(len(new_turns))
        rows = [new_turn_row(session_id, turn) for turn in new_turns]

        def work(transaction: Transaction) -> list[int]:
            ids = insert_turns(transaction, insert, rows)
            saved = list(zip(ids, new_turns, strict=True))
            attachment.run(transaction, session_id, saved)
            outcomes = [new_outcome_row(session_id, i, turn) for i, turn in saved]
            insert_outcomes.run(transaction, outcomes)
            return ids

        return self.store.write(work, SessionLock(session_id))

    def add_context(self, entity_id: int, text: str, at: float) -> float:
        """Add a snippet that belongs to no turn; it counts as newer than every turn so far.
        Returns the entity's ``last_seen`` afterwards."""
        queries = self._queries
        entity = self.store.read(lambda t: t.run(queries.entity_session, {"entity_id": entity_id}))
        if not entity:
            raise LookupError("the entity no longer exists")

        def work(transaction: Transaction) -> float:
            rows = transaction.run(queries.entity_session, {"entity_id": entity_id})
            if not rows:
                raise LookupError("the entity no longer exists")
            values = {
                "session_id": rows[0].session_id,
                "entity_id": entity_id,
                "text": text,
                "created_at": at,
            }
            transaction.run(queries.add_context, values)
            last_seen = max(rows[0].last_seen, at)
            transaction.run(queries.set_last_seen, {"entity_id": entity_id, "last_seen": last_seen})
            return float(last_seen)

        return self.store.write(work, SessionLock(entity[0].session_id))

    # -- reads --------------------------------------------------------------------------
    # ``visible``: the session's retention at this moment, or None without a policy (the
    # reads are then exactly the plain ones). A ``..._work`` method builds the unit of work
    # that the sync read here and the async one (:mod:`async_repository`) both run.

    def has_turn(self, session_id: str, idempotency_key: str) -> bool:
        return bool(self.store.read(self.has_turn_work(session_id, idempotency_key)))

    def has_turn_work(self, session_id: str, idempotency_key: str) -> Callable[[Transaction], Any]:
        values = {"session_id": session_id, "idempotency_key": idempotency_key}
        statement = self._queries.turn_by_key
        return lambda transaction: transaction.run(statement, values)

    def find_entity(
        self, session_id: str, key: str, visible: Visibility | None = None
    ) -> EntityRecord | None:
        """The entity of ``key`` (None if there is none, or none of its snippets shows)."""
        if visible is None:
            rows = self._one(self._queries.entity_by_key, {"session_id": session_id, "key": key})
            return entity_record(rows[0]) if rows else None

        def work(transaction: Transaction) -> EntityRecord | None:
            found = self._visible_entity(transaction, session_id, key, visible)
            return found[0] if found else None

        return self.store.read(work, snapshot=True)

    def _visible_entity(
        self, transaction: Transaction, session_id: str, key: str, visible: Visibility
    ) -> tuple[EntityRecord, int] | None:
        """The entity and how many of its snippets show, if any does."""
        found = transaction.run(self._queries.entity_by_key, {"session_id": session_id, "key": key})
        if not found:
            return None
        entity = entity_record(found[0])
        values = {"entity_id": entity.id, "cutoff": visible.cutoff_of(entity.entity_type)}
        count = int(transaction.run(self._visible.count_contexts, values)[0].count)
        count = _capped(count, visible.keep_last(entity.entity_type))
        return (entity, count) if count else None

    def recall(
        self,
        session_id: str,
        keys: Sequence[str],
        limit: int,
        visible: Visibility | None = None,
    ) -> list[tuple[EntityRecord, list[str]]]:
        """The entities among ``keys`` that have snippets, in the order of ``keys``, each
        with its last ``limit`` snippets (oldest first). One statement, which sees one
        snapshot by itself (on SQLite, one per ``RECALL_CHUNK`` keys), with no
        transaction around them."""
        unique = list(dict.fromkeys(keys))
        rows = self.store.read(self.recall_work(session_id, unique, limit, visible))
        return recalled(rows, unique, visible)

    def recall_work(
        self, session_id: str, unique: list[str], limit: int, visible: Visibility | None
    ) -> Callable[[Transaction], list[Any]]:
        """The recall statements' rows (:func:`recalled` makes them the result)."""
        batches = self._statements.recall_batches(
            session_id, unique, limit, aged=visible is not None
        )

        def work(transaction: Transaction) -> list[Any]:
            return [
                row for statement, values in batches for row in transaction.run(statement, values)
            ]

        return work

    def _recent(
        self,
        transaction: Transaction,
        entity_id: int,
        limit: int | None,
        visible: Visibility | None = None,
        entity_type: str = "",
    ) -> list[str]:
        if visible is not None:
            return self._recent_visible(transaction, entity_id, limit, visible, entity_type)
        if limit is None:
            rows = transaction.run(self._queries.all_contexts, {"entity_id": entity_id})
            return [row.text for row in rows]
        values = {"entity_id": entity_id, "limit": limit}
        newest = transaction.run(self._queries.recent_contexts, values)
        return [row.text for row in reversed(newest)]

    def _recent_visible(
        self,
        transaction: Transaction,
        entity_id: int,
        limit: int | None,
        visible: Visibility,
        entity_type: str,
    ) -> list[str]:
        if limit is None:
            rows = transaction.run(self._visible.all_contexts, {"entity_id": entity_id})
        else:
            values = {"entity_id": entity_id, "limit": limit}
            rows = transaction.run(self._visible.recent_contexts, values)[::-1]
        cutoff = visible.cutoff_of(entity_type)
        texts = [row.text for row in rows if row.created_at >= cutoff]
        return _newest(texts, visible.keep_last(entity_type))

    def recent_contexts(
        self,
        entity_id: int,
        limit: int | None,
        visible: Visibility | None = None,
        entity_type: str = "",
    ) -> list[str]:
        """The last ``limit`` snippets of an entity, oldest first (all of them for None)."""
        return self.store.read(
            lambda transaction: self._recent(transaction, entity_id, limit, visible, entity_type)
        )

    def entity_details(
        self, session_id: str, key: str, limit: int, visible: Visibility | None = None
    ) -> tuple[EntityRecord, int, list[str]] | None:
        """An entity, its snippet count and its last ``limit`` snippets, in one snapshot."""
        return self.store.read(self.details_work(session_id, key, limit, visible), snapshot=True)

    def details_work(
        self, session_id: str, key: str, limit: int, visible: Visibility | None
    ) -> Callable[[Transaction], tuple[EntityRecord, int, list[str]] | None]:
        queries = self._queries

        def work(transaction: Transaction) -> tuple[EntityRecord, int, list[str]] | None:
            if visible is not None:
                found = self._visible_entity(transaction, session_id, key, visible)
                if found is None:
                    return None
                entity, count = found
                recent = self._recent(transaction, entity.id, limit, visible, entity.entity_type)
                return entity, count, recent
            rows = transaction.run(queries.entity_by_key, {"session_id": session_id, "key": key})
            if not rows:
                return None
            entity = entity_record(rows[0])
            count = transaction.run(queries.count_contexts, {"entity_id": entity.id})[0].count
            return entity, int(count), self._recent(transaction, entity.id, limit)

        return work

    def iter_entities(
        self, session_id: str, visible: Visibility | None = None
    ) -> Iterator[EntityRecord]:
        """The session's entities in first-seen order, fetched a page at a time."""
        return itertools.chain.from_iterable(self._entity_pages(self._one, session_id, visible))

    def entities_work(
        self, session_id: str, visible: Visibility | None
    ) -> Callable[[Transaction], list[EntityRecord]]:
        """All the session's entities in first-seen order, read a page at a time on one
        connection (the async path's :meth:`iter_entities`)."""

        def work(transaction: Transaction) -> list[EntityRecord]:
            pages = self._entity_pages(transaction.run, session_id, visible)
            return list(itertools.chain.from_iterable(pages))

        return work

    def _entity_pages(
        self,
        run: Callable[[Any, dict[str, Any]], list[Any]],
        session_id: str,
        visible: Visibility | None,
    ) -> Iterator[list[EntityRecord]]:
        values: dict[str, Any] = {"session_id": session_id, "limit": PAGE_SIZE}
        first, following = self._queries.entities_first_page, self._queries.entities_next_page
        if visible is not None:
            typed = self._visible.typed(len(visible.type_cutoffs))
            first, following = typed.entities_first_page, typed.entities_next_page
            values.update(visible.cutoff_values())
        rows = run(first, values)
        while True:
            yield [entity_record(row) for row in rows]
            if len(rows) < PAGE_SIZE:
                return
            last = rows[-1]
            values.update(turn=last.first_turn_id, position=last.first_position, id=last.id)
            rows = run(following, values)

    def count_entities(self, session_id: str, visible: Visibility | None = None) -> int:
        if visible is None:
            rows = self._one(self._queries.count_entities, {"session_id": session_id})
        else:
            typed = self._visible.typed(len(visible.type_cutoffs))
            values = {"session_id": session_id, **visible.cutoff_values()}
            rows = self._one(typed.count_entities, values)
        return int(rows[0].count)

    def stats(self, session_id: str, visible: Visibility | None = None) -> SessionStats:
        return self.store.read(self.stats_work(session_id, visible), snapshot=visible is not None)

    def stats_work(
        self, session_id: str, visible: Visibility | None
    ) -> Callable[[Transaction], SessionStats]:
        """The session's counts: one statement, or (under a policy) several in one
        snapshot (read with ``snapshot=visible is not None``)."""
        if visible is None:
            values = {"session_id": session_id}
            statement = self._queries.stats

            def plain(transaction: Transaction) -> SessionStats:
                row = transaction.run(statement, values)[0]
                return SessionStats(
                    int(row.entity_count), int(row.message_count), int(row.total_contexts)
                )

            return plain
        typed = self._visible.typed(len(visible.type_cutoffs))
        reads, turn_values = self._turn_reads(session_id, visible)

        def work(transaction: Transaction) -> SessionStats:
            values = {"session_id": session_id, **visible.cutoff_values()}
            counts = transaction.run(typed.snippet_counts, values)
            snippets = sum(
                _capped(int(row.count), visible.keep_last(row.entity_type)) for row in counts
            )
            messages = int(transaction.run(reads.count, turn_values)[0].count)
            return SessionStats(len(counts), messages, snippets)

        return work


def recalled(
    rows: list[Any], unique: list[str], visible: Visibility | None
) -> list[tuple[EntityRecord, list[str]]]:
    """Recall rows grouped by entity, in the order of the keys, snippets oldest first;
    under a policy, only the snippets that show."""
    if visible is not None:
        rows = [row for row in rows if visible.visible(row.entity_type, row.created_at)]
    position = {key: i for i, key in enumerate(unique)}
    rows.sort(key=lambda row: (position[row.name_key], row.turn_seq, row.context_id))
    grouped: dict[str, tuple[EntityRecord, list[str]]] = {}
    for row in rows:
        entry = grouped.get(row.name_key)
        if entry is None:
            entry = grouped[row.name_key] = (entity_record(row), [])
        entry[1].append(row.text)
    if visible is not None:
        return [
            (entity, _newest(texts, visible.keep_last(entity.entity_type)))
            for entity, texts in grouped.values()
        ]
    return list(grouped.values())


def _newest(items: list[T], keep: int | None) -> list[T]:
    """The last ``keep`` of ``items`` (all of them for None)."""
    return items if keep is None or len(items) <= keep else items[len(items) - keep :]


def _capped(count: int, keep: int | None) -> int:
    return count if keep is None else min(count, keep)
