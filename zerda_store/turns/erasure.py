"""Erasure: forgetting one entity, and clearing a session.

Each runs as one unit of work holding its session's lock exclusively (on Postgres; on
SQLite the single writer does the same), so that it covers every turn committed before
it and no save slips in between its statements. No statement carries a list of ids: the
turns to delete are named by a subquery, and ids found in Python (turns whose extraction
failed) go one parameter set at a time, so no database's parameter limit applies.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.engine import Store
from ..db.schema import (
    contexts,
    entities,
    entity_aliases,
    entity_merges,
    extractions,
    in_same_session,
    turns,
)
from ..db.sql import Statements, param, session_param
from ..db.unit_of_work import SessionLock, Transaction
from ..identity.statements import IdentityStatements
from ..model.names import name_key
from ..model.records import EntityRecord, ForgetReceipt
from .queries import Queries
from .rows import entity_record

# What an extraction error that named a forgotten entity reads afterwards.
ERASED_ERROR = "(error text erased: it named a forgotten entity)"


class ErasureStatements(Statements):
    """The statements of erasure, compiled for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        compiled = self.compiled

        # Every statement names the session of each table it reads, subqueries too, so that
        # Citus runs it on the session's shard alone.
        entity = param("entity_id")
        snippets_in_session = contexts.c.session_id == session_param()
        turns_in_session = turns.c.session_id == session_param()
        turns_of_entity = sa.select(contexts.c.turn_id).where(
            snippets_in_session, contexts.c.entity_id == entity, contexts.c.turn_id.is_not(None)
        )
        self.turns_naming = compiled(
            sa.select(turns.c.id, turns.c.entity_names).where(
                turns_in_session, turns.c.id.in_(turns_of_entity)
            )
        )
        self.set_names = compiled(
            turns.update()
            .where(turns_in_session, turns.c.id == param("turn_id"))
            .values(entity_names=param("names", turns.c.entity_names.type))
        )
        self.count_snippets_with_turns = compiled(
            sa.select(sa.func.count().label("count")).where(
                snippets_in_session,
                sa.or_(contexts.c.entity_id == entity, contexts.c.turn_id.in_(turns_of_entity)),
            )
        )
        # Their snippets and ledger rows go with them (ON DELETE CASCADE).
        self.delete_turns_naming = compiled(
            turns.delete().where(
                turns.c.session_id == session_param(), turns.c.id.in_(turns_of_entity)
            )
        )
        self.delete_turn = compiled(
            turns.delete().where(turns_in_session, turns.c.id == param("turn_id"))
        )
        self.session_turns = compiled(
            sa.select(
                turns.c.id, turns.c.input_text, turns.c.output_text, turns.c.entity_names
            ).where(turns_in_session)
        )
        self.delete_turn_snippets = compiled(
            contexts.delete().where(snippets_in_session, contexts.c.turn_id == param("turn_id"))
        )
        self.delete_snippets = compiled(
            contexts.delete().where(snippets_in_session, contexts.c.entity_id == entity)
        )
        entity_in_session = sa.and_(
            entities.c.session_id == session_param(), entities.c.id == entity
        )
        self.delete_entity = compiled(entities.delete().where(entity_in_session))
        self.named_alongside = compiled(
            sa.select(contexts.c.entity_id)
            .where(
                snippets_in_session,
                contexts.c.turn_id.in_(turns_of_entity),
                contexts.c.entity_id != entity,
            )
            .distinct()
        )
        has_snippets = sa.exists().where(
            snippets_in_session,
            in_same_session(contexts.c.entity_id, entities.c.id),
        )
        self.delete_if_orphan = compiled(entities.delete().where(entity_in_session, ~has_snippets))
        self.errors_in_session = compiled(
            sa.select(extractions.c.id, extractions.c.error).where(
                extractions.c.session_id == session_param(), extractions.c.error.is_not(None)
            )
        )
        self.erase_error = compiled(
            extractions.update()
            .where(
                extractions.c.session_id == session_param(), extractions.c.id == param("ledger_id")
            )
            .values(error=ERASED_ERROR)
        )
        # The merge log holds names and snippet texts: it goes with what it logged.
        self.clear = [
            compiled(table.delete().where(table.c.session_id == session_param()))
            for table in (contexts, extractions, entity_aliases, entity_merges, entities, turns)
        ]
        self.forget_merges = compiled(
            entity_merges.delete().where(
                entity_merges.c.session_id == session_param(),
                sa.or_(
                    entity_merges.c.kept_entity_id == entity,
                    entity_merges.c.merged_entity_id == entity,
                ),
            )
        )


class Erasure:
    """Forgetting entities and clearing sessions of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._statements = store.statements(ErasureStatements)
        self._queries = store.statements(Queries)
        self._identity = store.statements(IdentityStatements)

    def clear(self, session_id: str) -> None:
        """Delete the session's turns, entities, snippets and ledger rows."""
        self.store.write(*self._clear(session_id))

    async def aclear(self, session_id: str) -> None:
        """:meth:`clear`, awaited."""
        await self.store.awrite(*self._clear(session_id))

    def _clear(self, session_id: str) -> tuple[Callable[[Transaction], None], SessionLock]:
        def work(transaction: Transaction) -> None:
            for statement in (*self._statements.clear, self._identity.clear_judgements):
                transaction.count(statement, {"session_id": session_id})

        return work, SessionLock(session_id, exclusive=True)

    def forget_entity(
        self, session_id: str, key: str, *, with_turns: bool, normalize: bool
    ) -> ForgetReceipt | None:
        """Erase one entity and its snippets in one transaction, and its name from the
        turns that mention it (or, ``with_turns``, those turns and all their snippets,
        and the other entities of those turns that are left with no snippet)."""
        return self.store.write(*self._forget(session_id, key, with_turns, normalize))

    async def aforget_entity(
        self, session_id: str, key: str, *, with_turns: bool, normalize: bool
    ) -> ForgetReceipt | None:
        """:meth:`forget_entity`, awaited."""
        return await self.store.awrite(*self._forget(session_id, key, with_turns, normalize))

    def _forget(
        self, session_id: str, key: str, with_turns: bool, normalize: bool
    ) -> tuple[Callable[[Transaction], ForgetReceipt | None], SessionLock]:
        def work(transaction: Transaction) -> ForgetReceipt | None:
            found = self._entity_named(transaction, session_id, key)
            if not found and not with_turns:
                return None
            if not found:
                # Forgotten before without its turns: their texts may still name it.
                return self._forget_turns_only(transaction, session_id, key, normalize)
            entity = entity_record(found[0])
            transaction.count(
                self._identity.forget_judgements, {"session_id": session_id, "entity_id": entity.id}
            )
            self._erase_errors_naming(transaction, session_id, entity.key, normalize)
            if with_turns:
                return self._forget_with_turns(transaction, session_id, entity, normalize)
            updated = self._drop_name_from_turns(transaction, session_id, entity, normalize)
            snippets = self._delete_entity(transaction, session_id, entity)
            return ForgetReceipt(entity.name, 1, snippets, 0, updated)

        return work, SessionLock(session_id, exclusive=True)

    def _entity_named(self, transaction: Transaction, session_id: str, key: str) -> list[Any]:
        """The entity whose key, or one of whose aliases' keys, is ``key``."""
        found = transaction.run(self._queries.entity_by_key, {"session_id": session_id, "key": key})
        if found:
            return found
        values = {"session_id": session_id, "alias_key": key}
        alias = transaction.run(self._identity.alias_by_key, values)
        if not alias:
            return []
        values = {"session_id": session_id, "entity_id": alias[0].entity_id}
        return transaction.run(self._identity.entity_by_id, values)

    def _delete_entity(
        self, transaction: Transaction, session_id: str, entity: EntityRecord
    ) -> int:
        """Delete the entity, its remaining snippets and the merges it took part in (their
        log holds its names and snippets); how many snippets."""
        values = {"session_id": session_id, "entity_id": entity.id}
        transaction.count(self._statements.forget_merges, values)
        snippets = transaction.count(self._statements.delete_snippets, values)
        transaction.count(self._statements.delete_entity, values)
        return snippets

    def _forget_with_turns(
        self, transaction: Transaction, session_id: str, entity: EntityRecord, normalize: bool
    ) -> ForgetReceipt:
        statements, values = self._statements, {"entity_id": entity.id, "session_id": session_id}
        snippets = transaction.run(statements.count_snippets_with_turns, values)[0].count
        # The other entities of those turns: deleted below if they are left with no snippet.
        others = {row.entity_id for row in transaction.run(statements.named_alongside, values)}
        turns_deleted = transaction.count(statements.delete_turns_naming, values)
        aliases = transaction.run(self._identity.aliases_of, values)
        keys = {entity.key, *(alias.alias_key for alias in aliases)}
        # Turns whose extraction failed, or missed the name, or was forgotten before
        # without its turns: a later reextract would bring the entity back from them.
        mentioning = self._delete_turns_mentioning(transaction, session_id, keys, normalize)
        self._delete_entity(transaction, session_id, entity)
        orphans = self._delete_orphans(transaction, session_id, others, mentioning.names, normalize)
        return ForgetReceipt(
            entity.name,
            1 + orphans,
            int(snippets) + mentioning.snippets,
            turns_deleted + mentioning.turns,
            0,
        )

    def _forget_turns_only(
        self, transaction: Transaction, session_id: str, key: str, normalize: bool
    ) -> ForgetReceipt | None:
        """``with_turns`` for a name no entity has (any more): the turns whose text holds
        it, their snippets, and the entities known only from them. None if there are none."""
        self._erase_errors_naming(transaction, session_id, key, normalize)
        mentioning = self._delete_turns_mentioning(transaction, session_id, {key}, normalize)
        if not mentioning.turns:
            return None
        orphans = self._delete_orphans(transaction, session_id, set(), mentioning.names, normalize)
        return ForgetReceipt(key, orphans, mentioning.snippets, mentioning.turns, 0)

    def _delete_turns_mentioning(
        self, transaction: Transaction, session_id: str, keys: set[str], normalize: bool
    ) -> _Mentioning:
        """Delete the session's turns whose text holds one of ``keys`` as whole words,
        with their snippets (one parameter set per turn)."""
        patterns = [_whole_words(key, normalize) for key in keys if key]
        found = _Mentioning()
        if not patterns:  # a name of no letters or digits mentions nothing
            return found
        rows = transaction.run(self._statements.session_turns, {"session_id": session_id})
        ids = []
        for row in rows:
            text = _searchable(f"{row.input_text} {row.output_text}", normalize)
            if any(pattern.search(text) for pattern in patterns):
                ids.append({"session_id": session_id, "turn_id": row.id})
                found.names.update(row.entity_names)
        found.snippets = transaction.run_many(self._statements.delete_turn_snippets, ids)
        found.turns = transaction.run_many(self._statements.delete_turn, ids)
        return found

    def _delete_orphans(
        self,
        transaction: Transaction,
        session_id: str,
        ids: set[int],
        names: set[str],
        normalize: bool,
    ) -> int:
        """Delete those of the entities (by id, or named in ``names``) that have no
        snippet left; how many."""
        for name in names:
            for row in self._entity_named(
                transaction, session_id, name_key(name, normalize=normalize)
            ):
                ids.add(row.id)
        return transaction.run_many(
            self._statements.delete_if_orphan,
            [{"session_id": session_id, "entity_id": i} for i in sorted(ids)],
        )

    def _erase_errors_naming(
        self, transaction: Transaction, session_id: str, key: str, normalize: bool
    ) -> None:
        """Extraction errors can quote the turn (an LLM's error may echo the prompt): the
        ledger rows whose error names the entity keep their row, not the text."""
        rows = transaction.run(self._statements.errors_in_session, {"session_id": session_id})
        pattern = _whole_words(key, normalize)
        naming = [
            {"session_id": session_id, "ledger_id": row.id}
            for row in rows
            if pattern.search(_searchable(row.error, normalize))
        ]
        transaction.run_many(self._statements.erase_error, naming)

    def _drop_name_from_turns(
        self, transaction: Transaction, session_id: str, entity: EntityRecord, normalize: bool
    ) -> int:
        of_entity = {"session_id": session_id, "entity_id": entity.id}
        rows = transaction.run(self._statements.turns_naming, of_entity)
        aliases = transaction.run(self._identity.aliases_of, of_entity)
        keys = {entity.key, *(alias.alias_key for alias in aliases)}
        updates = [
            {
                "session_id": session_id,
                "turn_id": row.id,
                "names": [
                    name
                    for name in row.entity_names
                    if name_key(name, normalize=normalize) not in keys
                ],
            }
            for row in rows
        ]
        transaction.run_many(self._statements.set_names, updates)
        return len(updates)


@dataclass
class _Mentioning:
    """What deleting the turns that mention a name deleted, and the names they listed."""

    turns: int = 0
    snippets: int = 0
    names: set[str] = field(default_factory=set)


def _whole_words(key: str, normalize: bool) -> re.Pattern[str]:
    """The name as whole words: "Ann" is not in "annual". Normalized keys are compared
    casefolded (a word's key keeps its capital: "Bill")."""
    return re.compile(rf"(?<!\w){re.escape(key.casefold() if normalize else key)}(?!\w)")


def _searchable(text: str, normalize: bool) -> str:
    """A text as the keys it may hold are searched for in it."""
    return name_key(text, normalize=normalize).casefold() if normalize else text
