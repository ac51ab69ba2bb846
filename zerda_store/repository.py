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

from .engine import Store
from .names import UNKNOWN_TYPE
from .queries import Queries, TurnReads
from .records import EntityRecord, NewTurn, SessionStats, TurnRecord
from .retention import Visibility
from .rows import context_row, entity_record, new_outcome_row, new_turn_row, turn_record
from .statements import PreparedInsert, TurnStatements
from .unit_of_work import SessionLock, Transaction
from .visible import VisibleQueries

PAGE_SIZE = 500
T = TypeVar("T")


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


class Repository:
    """Saves and reads of one store's memories (one per memory; the statements are the
    store's)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._statements = store.statements(TurnStatements)
        self._queries = store.statements(Queries)
        self._visible = store.statements(VisibleQueries)

    # -- writes -------------------------------------------------------------------------

    def save_turn(self, session_id: str, turn: NewTurn) -> int | None:
        """Store one turn with its entities and snippets; None if its idempotency key was
        already used in this session."""
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

        return self.store.write(work, SessionLock(session_id))

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
    # reads are then exactly the plain ones).

    def _one(self, statement: Any, values: dict[str, Any]) -> list[Any]:
        return self.store.read(lambda transaction: transaction.run(statement, values))

    def has_turn(self, session_id: str, idempotency_key: str) -> bool:
        values = {"session_id": session_id, "idempotency_key": idempotency_key}
        return bool(self._one(self._queries.turn_by_key, values))

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
        snapshot by itself, with no transaction around it (on SQLite, one per
        ``RECALL_CHUNK`` keys)."""
        unique = list(dict.fromkeys(keys))
        rows: list[Any] = []
        batches = self._statements.recall_batches(
            session_id, unique, limit, aged=visible is not None
        )
        for statement, values in batches:
            rows += self._one(statement, values)
        if visible is not None:
            rows = [row for row in rows if visible.visible(row.entity_type, row.created_at)]
        position = {key: i for i, key in enumerate(unique)}
        rows.sort(key=lambda row: (position[row.name_key], row.turn_seq, row.context_id))
        recalled: dict[str, tuple[EntityRecord, list[str]]] = {}
        for row in rows:
            entry = recalled.get(row.name_key)
            if entry is None:
                entry = recalled[row.name_key] = (entity_record(row), [])
            entry[1].append(row.text)
        if visible is not None:
            return [
                (entity, _newest(texts, visible.keep_last(entity.entity_type)))
                for entity, texts in recalled.values()
            ]
        return list(recalled.values())

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

        return self.store.read(work, snapshot=True)

    def iter_entities(
        self, session_id: str, visible: Visibility | None = None
    ) -> Iterator[EntityRecord]:
        """The session's entities in first-seen order, fetched a page at a time."""
        values: dict[str, Any] = {"session_id": session_id, "limit": PAGE_SIZE}
        first, following = self._queries.entities_first_page, self._queries.entities_next_page
        if visible is not None:
            typed = self._visible.typed(len(visible.type_cutoffs))
            first, following = typed.entities_first_page, typed.entities_next_page
            values.update(visible.cutoff_values())
        rows = self._one(first, values)
        while True:
            yield from (entity_record(row) for row in rows)
            if len(rows) < PAGE_SIZE:
                return
            last = rows[-1]
            values.update(turn=last.first_turn_id, position=last.first_position, id=last.id)
            rows = self._one(following, values)

    def count_entities(self, session_id: str, visible: Visibility | None = None) -> int:
        if visible is None:
            rows = self._one(self._queries.count_entities, {"session_id": session_id})
        else:
            typed = self._visible.typed(len(visible.type_cutoffs))
            values = {"session_id": session_id, **visible.cutoff_values()}
            rows = self._one(typed.count_entities, values)
        return int(rows[0].count)

    def _turn_reads(
        self, session_id: str, visible: Visibility | None
    ) -> tuple[TurnReads, dict[str, Any]]:
        """The turn reads to use, and the values every one of them takes."""
        if visible is None:
            return self._queries.turn_reads, {"session_id": session_id}
        return self._visible.turn_reads, {
            "session_id": session_id,
            "turn_cutoff": visible.turn_cutoff,
        }

    def count_turns(self, session_id: str, visible: Visibility | None = None) -> int:
        reads, values = self._turn_reads(session_id, visible)
        return int(self._one(reads.count, values)[0].count)

    def stats(self, session_id: str, visible: Visibility | None = None) -> SessionStats:
        if visible is None:
            row = self._one(self._queries.stats, {"session_id": session_id})[0]
            return SessionStats(
                int(row.entity_count), int(row.message_count), int(row.total_contexts)
            )
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

        return self.store.read(work, snapshot=True)

    def turns_page(
        self,
        session_id: str,
        offset: int,
        limit: int,
        *,
        newest_first: bool = False,
        visible: Visibility | None = None,
    ) -> list[TurnRecord]:
        """``limit`` turns from position ``offset``, in saved order (or counting from the
        newest turn, for negative indexes)."""
        reads, values = self._turn_reads(session_id, visible)
        statement = reads.newest_first if newest_first else reads.page
        values.update(offset=offset, limit=limit)
        return [turn_record(row) for row in self._one(statement, values)]

    def iter_turns(
        self,
        session_id: str,
        *,
        offset: int = 0,
        count: int | None = None,
        newest_first: bool = False,
        visible: Visibility | None = None,
    ) -> Iterator[TurnRecord]:
        """``count`` turns (None: all the rest) from position ``offset`` in saved order, or
        counting from the newest turn back, fetched a page at a time."""
        pages = self._turn_pages(
            self._one, session_id, offset, count, PAGE_SIZE, newest_first, visible
        )
        return itertools.chain.from_iterable(pages)

    def turns_slice(
        self, session_id: str, index: slice, visible: Visibility | None = None
    ) -> list[TurnRecord]:
        """The turns ``index`` picks, as the same slice of a list of the session's turns
        would (any step; bounds negative or out of range), seen in one snapshot. The turns
        from the first to the last one picked are read a page at a time."""
        return self.store.read(
            lambda transaction: self._slice(transaction, session_id, index, visible),
            snapshot=True,
        )

    def _slice(
        self,
        transaction: Transaction,
        session_id: str,
        index: slice,
        visible: Visibility | None,
    ) -> list[TurnRecord]:
        reads, values = self._turn_reads(session_id, visible)
        count = transaction.run(reads.count, values)[0].count
        positions = range(*index.indices(int(count)))
        if not positions:
            return []
        stride = abs(positions.step)
        span = (len(positions) - 1) * stride + 1
        page_size = span if stride == 1 else PAGE_SIZE  # a step of 1 keeps all it reads
        pages = self._turn_pages(
            transaction.run, session_id, min(positions), span, page_size, False, visible
        )
        picked = list(itertools.islice(itertools.chain.from_iterable(pages), 0, None, stride))
        return picked if positions.step > 0 else picked[::-1]

    def _turn_pages(
        self,
        run: Callable[[Any, dict[str, Any]], list[Any]],
        session_id: str,
        offset: int,
        count: int | None,
        page_size: int,
        newest_first: bool,
        visible: Visibility | None = None,
    ) -> Iterator[list[TurnRecord]]:
        """Pages of ``count`` turns (None: to the end) from position ``offset``. Only the
        first page is found by its offset; each next one by the id of the last turn seen,
        so that the database never skips the turns before it again."""
        reads, shared = self._turn_reads(session_id, visible)
        if newest_first:
            statement, following, key = reads.newest_first, reads.before, "before"
        else:
            statement, following, key = reads.page, reads.after, "after"
        values: dict[str, Any] = {**shared, "offset": offset}
        remaining = count
        while remaining is None or remaining > 0:
            limit = page_size if remaining is None else min(page_size, remaining)
            rows = run(statement, {**values, "limit": limit})
            yield [turn_record(row) for row in rows]
            if len(rows) < limit:
                return
            if remaining is not None:
                remaining -= limit
            statement, values = following, {**shared, key: rows[-1].id}


def _newest(items: list[T], keep: int | None) -> list[T]:
    """The last ``keep`` of ``items`` (all of them for None)."""
    return items if keep is None or len(items) <= keep else items[len(items) - keep :]


def _capped(count: int, keep: int | None) -> int:
    return count if keep is None else min(count, keep)
