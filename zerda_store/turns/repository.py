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

from ..db.engine import Store
from ..db.unit_of_work import SessionLock, Transaction
from ..identity.resolution import KnownKeyRules, Resolver, check_key_rules
from ..identity.statements import IdentityStatements
from ..model.names import FOLD_V1, KEY_RULES, KeyRules
from ..model.records import EntityRecord, Mention, NewTurn, SessionStats
from ..retention.policies import Visibility
from .attachment import Attachment, insert_turns, upsert_entities
from .history import PAGE_SIZE, TurnHistory
from .rows import entity_record, new_outcome_row, new_turn_row
from .statements import TurnStatements

__all__ = ["PAGE_SIZE", "Attachment", "Repository", "insert_turns", "recalled", "upsert_entities"]

T = TypeVar("T")


class Repository(TurnHistory):
    """Saves and reads of one store's memories (one per memory; the statements are the
    store's)."""

    def __init__(self, store: Store, rules: KeyRules | None = None) -> None:
        super().__init__(store)
        self._statements = store.statements(TurnStatements)
        self._rules = rules
        self._identity = store.statements(IdentityStatements)
        self._resolver = Resolver(self._identity, rules) if rules is not None else None
        self.resolver = self._resolver
        self._known = store.statements(KnownKeyRules).checked

    def _checked_rules(self, session_id: str) -> Callable[[Transaction, float], None]:
        """What a save runs first: the session's key rules checked (and recorded by its
        first save), once per store and session."""
        rules = self._rules
        if rules is None or (session_id, rules.name) in self._known:
            return _nothing

        def check(transaction: Transaction, at: float) -> None:
            check_key_rules(transaction, self._identity, session_id, rules, at)

        return check

    def _remember_rules(self, session_id: str) -> None:
        if self._rules is not None:
            self._known.add((session_id, self._rules.name))

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
        attachment = Attachment(self._statements, [turn], self._resolver)
        insert_outcome = self._statements.outcomes.prepare(1)
        turn_row = new_turn_row(session_id, turn)
        check_rules = self._checked_rules(session_id)

        def work(transaction: Transaction) -> int | None:
            check_rules(transaction, turn.created_at)
            inserted = insert_turn.run(transaction, [turn_row])
            if not inserted:
                return None
            turn_id = int(inserted[0].id)
            attachment.run(transaction, session_id, [(turn_id, turn)])
            insert_outcome.run(transaction, [new_outcome_row(session_id, turn_id, turn)])
            self._remember_rules(session_id)
            return turn_id

        return work, SessionLock(session_id)

    def save_turns(self, session_id: str, new_turns: Sequence[NewTurn]) -> list[int]:
        """Store many turns in one transaction, as a loop of :meth:`save_turn` would."""
        if not new_turns:
            return []
        insert = self._statements.turns.prepare(len(new_turns))
        attachment = Attachment(self._statements, new_turns, self._resolver)
        insert_outcomes = self._statements.outcomes.prepare(len(new_turns))
        rows = [new_turn_row(session_id, turn) for turn in new_turns]
        check_rules = self._checked_rules(session_id)

        def work(transaction: Transaction) -> list[int]:
            check_rules(transaction, new_turns[0].created_at)
            ids = insert_turns(transaction, insert, rows)
            saved = list(zip(ids, new_turns, strict=True))
            attachment.run(transaction, session_id, saved)
            outcomes = [new_outcome_row(session_id, i, turn) for i, turn in saved]
            insert_outcomes.run(transaction, outcomes)
            self._remember_rules(session_id)
            return ids

        return self.store.write(work, SessionLock(session_id))

    def add_context(self, session_id: str, entity_id: int, text: str, at: float) -> float:
        """Add a snippet that belongs to no turn; it counts as newer than every turn of the
        session so far. Returns the entity's ``last_seen`` afterwards."""
        queries = self._queries
        of_entity = {"session_id": session_id, "entity_id": entity_id}

        def work(transaction: Transaction) -> float:
            rows = transaction.run(queries.entity_session, of_entity)
            if not rows:
                raise LookupError("the entity no longer exists")
            values = {
                "session_id": rows[0].session_id,
                "entity_id": entity_id,
                "turn_seq": rows[0].newest_turn,
                "text": text,
                "created_at": at,
            }
            transaction.run(queries.add_context, values)
            last_seen = max(rows[0].last_seen, at)
            transaction.run(queries.set_last_seen, {**of_entity, "last_seen": last_seen})
            return float(last_seen)

        return self.store.write(work, SessionLock(session_id))

    # -- reads --------------------------------------------------------------------------

    def key_rules(self, session_id: str) -> KeyRules | None:
        """The key rules the session was keyed with, or None if none is recorded (a session
        never written)."""
        rows = self._one(self._identity.rules_of, {"session_id": session_id})
        return KEY_RULES.get(rows[0].key_rules, FOLD_V1) if rows else None

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
        self, session_id: str, mention: Mention, visible: Visibility | None = None
    ) -> EntityRecord | None:
        """The entity ``mention`` names (None if there is none, or none of its snippets
        shows)."""

        def work(transaction: Transaction) -> EntityRecord | None:
            key = self._resolved(transaction, session_id, mention)
            if visible is None:
                values = {"session_id": session_id, "key": key}
                rows = transaction.run(self._queries.entity_by_key, values)
                return entity_record(rows[0]) if rows else None
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
        values = {
            "session_id": session_id,
            "entity_id": entity.id,
            "cutoff": visible.cutoff_of(entity.entity_type),
        }
        count = int(transaction.run(self._visible.count_contexts, values)[0].count)
        count = _capped(count, visible.keep_last(entity.entity_type))
        return (entity, count) if count else None

    def recall(
        self,
        session_id: str,
        mentions: Sequence[Mention],
        limit: int,
        visible: Visibility | None = None,
    ) -> list[tuple[EntityRecord, list[str]]]:
        """The entities the mentions name that have snippets, in the order of the mentions,
        each with its last ``limit`` snippets (oldest first). The mentions are resolved
        (aliases, titled forms) by one statement, then recalled by one statement (on
        SQLite, one per ``RECALL_CHUNK`` keys), with no transaction around them."""
        rows, unique = self.store.read(self.recall_work(session_id, mentions, limit, visible))
        return recalled(rows, unique, visible)

    def recall_work(
        self,
        session_id: str,
        mentions: Sequence[Mention],
        limit: int,
        visible: Visibility | None,
    ) -> Callable[[Transaction], tuple[list[Any], list[str]]]:
        """The recall statements' rows and the keys recalled, in order (:func:`recalled`
        makes them the result)."""
        resolver = self._resolver
        aged = visible is not None

        def recall(transaction: Transaction, keys: list[str]) -> list[Any]:
            batches = self._statements.recall_batches(session_id, keys, limit, aged=aged)
            return [
                row for statement, values in batches for row in transaction.run(statement, values)
            ]

        def work(transaction: Transaction) -> tuple[list[Any], list[str]]:
            # Mentions of entities by their own keys (the usual case) take one statement;
            # only the others are resolved (aliases, titled forms), and recalled after.
            own = list(dict.fromkeys(m.key for m in mentions))
            rows = recall(transaction, own)
            found = {row.name_key for row in rows}
            missing = [m for m in mentions if m.key not in found]
            if resolver is None or not missing:
                return rows, own
            targets = resolver.targets(transaction, session_id, missing)
            unique = list(
                dict.fromkeys(targets[m.key].key if m.key in targets else m.key for m in mentions)
            )
            more = [key for key in unique if key not in found and key not in own]
            return (rows + recall(transaction, more) if more else rows), unique

        return work

    def _resolved(self, transaction: Transaction, session_id: str, mention: Mention) -> str:
        """The key of the entity a name given to the API names (its own, an alias's, or
        the entity its titled form joins)."""
        if self._resolver is None:
            return mention.key
        targets = self._resolver.targets(transaction, session_id, [mention])
        return targets[mention.key].key if mention.key in targets else mention.key

    def _recent(
        self,
        transaction: Transaction,
        of_entity: dict[str, Any],
        limit: int | None,
        visible: Visibility | None = None,
        entity_type: str = "",
    ) -> list[str]:
        """``of_entity``: the entity's ``session_id`` and ``entity_id``."""
        if visible is not None:
            return self._recent_visible(transaction, of_entity, limit, visible, entity_type)
        if limit is None:
            rows = transaction.run(self._queries.all_contexts, of_entity)
            return [row.text for row in rows]
        newest = transaction.run(self._queries.recent_contexts, {**of_entity, "limit": limit})
        return [row.text for row in reversed(newest)]

    def _recent_visible(
        self,
        transaction: Transaction,
        of_entity: dict[str, Any],
        limit: int | None,
        visible: Visibility,
        entity_type: str,
    ) -> list[str]:
        if limit is None:
            rows = transaction.run(self._visible.all_contexts, of_entity)
        else:
            values = {**of_entity, "limit": limit}
            rows = transaction.run(self._visible.recent_contexts, values)[::-1]
        cutoff = visible.cutoff_of(entity_type)
        texts = [row.text for row in rows if row.created_at >= cutoff]
        return _newest(texts, visible.keep_last(entity_type))

    def recent_contexts(
        self,
        session_id: str,
        entity_id: int,
        limit: int | None,
        visible: Visibility | None = None,
        entity_type: str = "",
    ) -> list[str]:
        """The last ``limit`` snippets of an entity, oldest first (all of them for None)."""
        of_entity = {"session_id": session_id, "entity_id": entity_id}
        return self.store.read(
            lambda transaction: self._recent(transaction, of_entity, limit, visible, entity_type)
        )

    def entity_details(
        self, session_id: str, mention: Mention, limit: int, visible: Visibility | None = None
    ) -> tuple[EntityRecord, int, list[str], list[str]] | None:
        """An entity, its snippet count, its last ``limit`` snippets and its aliases, in
        one snapshot."""
        work = self.details_work(session_id, mention, limit, visible)
        return self.store.read(work, snapshot=True)

    def details_work(
        self, session_id: str, mention: Mention, limit: int, visible: Visibility | None
    ) -> Callable[[Transaction], tuple[EntityRecord, int, list[str], list[str]] | None]:
        def work(transaction: Transaction) -> tuple[EntityRecord, int, list[str], list[str]] | None:
            key = self._resolved(transaction, session_id, mention)
            found = self._details(transaction, session_id, key, limit, visible)
            if found is None:
                return None
            values = {"session_id": session_id, "entity_id": found[0].id}
            aliases = transaction.run(self._identity.aliases_of, values)
            return (*found, [row.alias for row in aliases])

        return work

    def _details(
        self,
        transaction: Transaction,
        session_id: str,
        key: str,
        limit: int,
        visible: Visibility | None,
    ) -> tuple[EntityRecord, int, list[str]] | None:
        queries = self._queries
        if visible is not None:
            found = self._visible_entity(transaction, session_id, key, visible)
            if found is None:
                return None
            entity, count = found
            of_entity = {"session_id": session_id, "entity_id": entity.id}
            recent = self._recent(transaction, of_entity, limit, visible, entity.entity_type)
            return entity, count, recent
        rows = transaction.run(queries.entity_by_key, {"session_id": session_id, "key": key})
        if not rows:
            return None
        entity = entity_record(rows[0])
        of_entity = {"session_id": session_id, "entity_id": entity.id}
        count = transaction.run(queries.count_contexts, of_entity)[0].count
        return entity, int(count), self._recent(transaction, of_entity, limit)

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


def _nothing(_transaction: Transaction, _at: float) -> None:
    return None


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
