"""The memory's reads: recall, an entity's details, its snippets, the session's entities
and stats (:class:`Reads`, the base of :class:`repository.Repository`, which adds the
saves). Each ``..._work`` method builds the unit of work that the sync read here and the
async one (:mod:`aio.repository`) both run; ``visible`` is the session's retention at this
moment, or None without a policy (the reads are then exactly the plain ones).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from operator import ne
from typing import Any

from ..db.execution.unit_of_work import OneStatement, Transaction
from ..db.routes import Routes, SessionsCall
from ..db.store import StoreCore
from ..identity.resolution import Resolver
from ..identity.statements import IdentityStatements
from ..model.names import FOLD_V1, KEY_RULES, KeyRules
from ..model.records import MENTION_CORE_KEY, MENTION_KEY, EntityRecord, Mention, SessionStats
from ..retention.policy import Visibility
from .delegated import DelegatedCalls
from .history import PAGE_SIZE, TurnHistory
from .resolving_recall import ResolvingRecall, marked_rows, resolved
from .rows import entity_record
from .statements import TurnStatements


class Reads(TurnHistory):
    """The reads of one store's memories (the statements are the store's)."""

    def __init__(self, store: StoreCore, rules: KeyRules | None = None) -> None:
        super().__init__(store)
        self._statements = store.statements(TurnStatements)
        self._rules = rules
        self._identity = store.statements(IdentityStatements)
        self._resolver = Resolver(self._identity, rules) if rules is not None else None
        self.resolver = self._resolver
        self._resolving = store.statements(ResolvingRecall)
        self.routes = Routes(store)

    def key_rules(self, session_id: str) -> KeyRules | None:
        """The key rules the session was keyed with, or None if none is recorded (a session
        never written)."""
        rows = self._one(self._identity.rules_of, {"session_id": session_id})
        return KEY_RULES.get(rows[0].key_rules, FOLD_V1) if rows else None

    def has_turn(self, session_id: str, idempotency_key: str) -> bool:
        return bool(self.store.read(self.has_turn_work(session_id, idempotency_key)))

    def has_turn_work(self, session_id: str, idempotency_key: str) -> OneStatement[list[Any]]:
        values = {"session_id": session_id, "idempotency_key": idempotency_key}
        return OneStatement(self._queries.turn_by_key, values, list)

    def find_entity(
        self, session_id: str, mention: Mention, visible: Visibility | None = None
    ) -> EntityRecord | None:
        """The entity ``mention`` names (None if there is none, or none of its snippets
        shows)."""
        by_probe = self._by_probe()

        def work(transaction: Transaction) -> EntityRecord | None:
            key = self._resolved(transaction, session_id, mention, by_probe)
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
    ) -> list[tuple[str, list[str]]]:
        """The entities the mentions name that have snippets, in the order of the mentions:
        each one's name with its last ``limit`` snippets (oldest first). The mentions are
        resolved (aliases, titled forms) in the statement that reads the snippets, with no
        transaction around it (:mod:`resolving_recall`)."""
        rows, unique = self.routes.read(self.recall_work(session_id, mentions, limit, visible))
        return recalled(rows, unique, visible)

    def recall_work(
        self, session_id: str, mentions: Sequence[Mention], limit: int, visible: Visibility | None
    ) -> Callable[[Transaction], tuple[list[Any], list[str]]]:
        """The recall's snippet rows and the keys recalled, in order (for :func:`recalled`).
        Postgres: one statement (:class:`OneStatement`) resolves and reads. SQLite: the own
        keys with the session's mark (``resolution_possible``), then the resolving statement
        if a key names no entity and resolution could find one (titled, or marked)."""
        resolver = self._resolver
        aged = visible is not None
        own = list(dict.fromkeys(map(MENTION_KEY, mentions)))
        if resolver is None or not self._resolving.in_one_statement:
            first = self._statements.recall_batches(
                session_id, own, limit, aged=aged, marked=resolver is not None
            )
        if resolver is None:
            if len(first) > 1:
                return lambda transaction: (transaction.run_all(first), own)
            statement, values = first[0] if first else (None, None)
            return OneStatement(statement, values, lambda rows: (rows, own))
        if not mentions:
            return OneStatement(None, None, lambda _rows: ([], []))
        if self._resolving.in_one_statement:
            values = ResolvingRecall.values(session_id, mentions, limit)
            then = partial(resolved, resolver, mentions)
            if self.routes.delegated():  # Citus: run on the session's worker
                calls = self.store.statements(DelegatedCalls)
                return SessionsCall(session_id, calls.recall, values, then, calls.recall_here)
            statement = self._resolving.statement(aged, self.routes.routed())
            return OneStatement(statement, values, then)
        # A titled form (its key is not its core's): resolve.
        titled = any(map(ne, map(MENTION_KEY, mentions), map(MENTION_CORE_KEY, mentions)))

        def work(transaction: Transaction) -> tuple[list[Any], list[str]]:
            rows, possible = marked_rows(
                transaction.run(*first[0]) if len(first) == 1 else transaction.run_all(first)
            )
            if not (possible or titled) or {row.name_key for row in rows} >= set(own):
                return rows, own  # nothing to resolve, or every key names an entity
            values = ResolvingRecall.values(session_id, mentions, limit)
            rows = transaction.run(self._resolving.statement(aged), values)
            return resolved(resolver, mentions, rows)

        return work

    def _by_probe(self) -> bool:
        """Whether the resolver finds candidates by a probe per key: on Postgres, unless
        Citus distributes the tables (read before any transaction, once per store)."""
        return self._resolver is not None and not self.routes.routed()

    def _resolved(
        self, transaction: Transaction, session_id: str, mention: Mention, by_probe: bool
    ) -> str:
        """The key of the entity a name given to the API names (its own, an alias's, or
        the entity its titled form joins)."""
        if self._resolver is None:
            return mention.key
        targets = self._resolver.targets(transaction, session_id, [mention], by_probe=by_probe)
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
        return visible.newest(texts, entity_type)

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
        by_probe = self._by_probe()

        def work(transaction: Transaction) -> tuple[EntityRecord, int, list[str], list[str]] | None:
            key = self._resolved(transaction, session_id, mention, by_probe)
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
        reads, turn_values = self._turn_reads(session_id, visible)
        counting = self.snippet_counts_work(session_id, visible)

        def work(transaction: Transaction) -> SessionStats:
            counts = counting(transaction)
            messages = int(transaction.run(reads.count, turn_values)[0].count)
            return SessionStats(len(counts), messages, sum(counts.values()))

        return work

    def snippet_counts(self, session_id: str, visible: Visibility) -> dict[int, int]:
        """How many snippets of each entity show under ``visible`` (each cut at its
        ``keep_last``), by entity id; an entity none of whose snippets shows is not in it."""
        return self.store.read(self.snippet_counts_work(session_id, visible), snapshot=True)

    def snippet_counts_work(
        self, session_id: str, visible: Visibility
    ) -> Callable[[Transaction], dict[int, int]]:
        typed = self._visible.typed(len(visible.type_cutoffs))
        values = {"session_id": session_id, **visible.cutoff_values()}

        def work(transaction: Transaction) -> dict[int, int]:
            rows = transaction.run(typed.snippet_counts, values)
            return {
                int(row.entity_id): _capped(int(row.count), visible.keep_last(row.entity_type))
                for row in rows
            }

        return work


def _capped(count: int, keep: int | None) -> int:
    return count if keep is None else min(count, keep)


def recalled(
    rows: list[Any], unique: list[str], visible: Visibility | None
) -> list[tuple[str, list[str]]]:
    """Recall rows grouped by entity, in the order of the keys: each entity's name with its
    snippets oldest first; under a policy, only the snippets that show. An entity's rows
    all carry its name and type."""
    if visible is not None:
        rows = [row for row in rows if visible.visible(row.entity_type, row.created_at)]
    by_entity: dict[str, list[Any]] = {}
    for row in rows:  # in any order: each entity's rows are put in order below
        group = by_entity.get(row.name_key)
        if group is None:
            by_entity[row.name_key] = [row]
        else:
            group.append(row)
    found = []
    for key in unique:
        group = by_entity.get(key)
        if group is None:
            continue
        group.sort(key=_SAVED_ORDER)
        texts = list(map(_TEXT, group))
        if visible is not None:
            texts = visible.newest(texts, group[0].entity_type)
        found.append((group[0].name, texts))
    return found


# An entity's rows, oldest first.
_SAVED_ORDER = operator.attrgetter("turn_seq", "context_id")
_TEXT = operator.attrgetter("text")
