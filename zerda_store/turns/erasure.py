"""Erasure: forgetting one entity, and clearing a session.

Each ends in one unit of work holding its session's lock exclusively (on Postgres; on
SQLite the single writer does the same), so that it covers every turn committed before
it and no save slips in between its statements. No statement carries a list of ids: the
turns to delete are named by a subquery, and ids found in Python (turns whose extraction
failed) go one parameter set at a time, so no database's parameter limit applies.

An erasure that reaches more than ``ERASURE_BATCH`` turns (a person named in a million
turns) is planned first, in a read that holds no lock, and those turns are deleted (or
their entity lists rewritten) ``ERASURE_BATCH`` at a time, each batch a short transaction
of its own: other sessions' saves, which on SQLite wait for the one writer, never wait
for more than a batch. The last unit of work then does the rest as above, looking only
at the turns saved since the plan. Between batches a read of that session may see some
of its turns gone; an erasure interrupted there is finished by running it again (the
entity is deleted last).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Generator, Iterable, Iterator
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
        later = turns.c.id > param("after_id")
        self.turns_naming = compiled(
            sa.select(turns.c.id, turns.c.entity_names).where(
                turns_in_session, later, turns.c.id.in_(turns_of_entity)
            )
        )
        self.newest_turn = compiled(
            sa.select(sa.func.coalesce(sa.func.max(turns.c.id), 0).label("id")).where(
                turns_in_session
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
            ).where(turns_in_session, later)
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
        self, session_id: str, key: str, *, with_turns: bool, normalize: bool, dry_run: bool = False
    ) -> ForgetReceipt | None:
        """Erase one entity and its snippets, and its name from the turns that mention it
        (or, ``with_turns``, those turns and all their snippets, and the other entities of
        those turns that are left with no snippet); in one transaction, or in batches and
        then one transaction when it reaches more than ``ERASURE_BATCH`` turns.
        ``dry_run``: the receipt of the erasure, done in one transaction rolled back."""
        if dry_run:
            work = self._forget_work(session_id, key, with_turns, normalize, _Done())
            try:
                self.store.write(_rolled_back(work), SessionLock(session_id, exclusive=True))
            except _RolledBack as undone:
                return undone.receipt
        steps = self._forget_steps(session_id, key, with_turns, normalize)
        done: Any = None
        pause = 0.0
        while True:
            try:
                work, lock = steps.send(done)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
            time.sleep(pause)  # the waiting saves' turn, between two batches (SQLite)
            began = time.monotonic()
            done = (
                self.store.read(work, snapshot=True)
                if lock is None
                else self.store.write(work, lock)
            )
            pause = self._pause(lock, time.monotonic() - began)

    async def aforget_entity(
        self, session_id: str, key: str, *, with_turns: bool, normalize: bool
    ) -> ForgetReceipt | None:
        """:meth:`forget_entity`, awaited."""
        steps = self._forget_steps(session_id, key, with_turns, normalize)
        done: Any = None
        pause = 0.0
        while True:
            try:
                work, lock = steps.send(done)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
            await asyncio.sleep(pause)
            began = time.monotonic()
            done = (
                await self.store.aread(work, snapshot=True)
                if lock is None
                else await self.store.awrite(work, lock)
            )
            pause = self._pause(lock, time.monotonic() - began)

    def _pause(self, lock: SessionLock | None, took: float) -> float:
        """How long to wait after a batch before the next: on SQLite, whose waiting writers
        poll for the one write lock (they are not queued), as long as the batch took (at
        most ``BATCH_PAUSE``), so that they get it in between; elsewhere none."""
        if lock is None or self.store.dialect != "sqlite":
            return 0.0
        return min(took, BATCH_PAUSE)

    def _forget_steps(
        self, session_id: str, key: str, with_turns: bool, normalize: bool
    ) -> Generator[_Step, Any, ForgetReceipt | None]:
        """The units of work of one erasure, each sent the previous one's result: a plan
        (a read, no lock), its batches, then the last unit of work."""
        lock = SessionLock(session_id, exclusive=True)
        plan: _Plan = yield self._plan_work(session_id, key, with_turns, normalize), None
        done = _Done()
        if len(plan.turn_ids) + len(plan.updates) > ERASURE_BATCH:
            for batch in _chunks(plan.turn_ids):
                done.add((yield self._delete_batch_work(session_id, batch), lock))
            for updates in _chunks(plan.updates):
                done.updated += yield self._update_batch_work(updates), lock
            done.after_id = plan.newest
            done.others, done.names = plan.others, plan.names
        work = self._forget_work(session_id, key, with_turns, normalize, done)
        receipt: ForgetReceipt | None = yield work, lock
        return receipt

    def _plan_work(
        self, session_id: str, key: str, with_turns: bool, normalize: bool
    ) -> Callable[[Transaction], _Plan]:
        """What an erasure will reach, read without a lock: the turns it deletes (or whose
        entity lists it rewrites), the other entities they name, and the newest turn."""

        def work(transaction: Transaction) -> _Plan:
            plan = _Plan()
            values = {"session_id": session_id}
            plan.newest = int(transaction.run(self._statements.newest_turn, values)[0].id)
            found = self._entity_named(transaction, session_id, key)
            if not found and not with_turns:
                return plan
            keys = {key}
            if found:
                entity = entity_record(found[0])
                of_entity = {**values, "entity_id": entity.id}
                aliases = transaction.run(self._identity.aliases_of, of_entity)
                keys = {entity.key, *(alias.alias_key for alias in aliases)}
                every = {**of_entity, "after_id": 0}
                naming = transaction.run(self._statements.turns_naming, every)
                if not with_turns:
                    plan.updates = _name_updates(session_id, naming, keys, normalize)
                    return plan
                plan.turn_ids = {row.id for row in naming}
                plan.others = {
                    row.entity_id
                    for row in transaction.run(self._statements.named_alongside, of_entity)
                }
            mentioning = self._turns_mentioning(transaction, session_id, keys, normalize, 0)
            plan.turn_ids.update(row.id for row in mentioning)
            plan.names.update(name for row in mentioning for name in row.entity_names)
            return plan

        return work

    def _delete_batch_work(
        self, session_id: str, turn_ids: list[int]
    ) -> Callable[[Transaction], tuple[int, int]]:
        """Delete these turns and their snippets; how many snippets, how many turns."""
        ids = [{"session_id": session_id, "turn_id": turn_id} for turn_id in turn_ids]

        def work(transaction: Transaction) -> tuple[int, int]:
            snippets = transaction.run_many(self._statements.delete_turn_snippets, ids)
            return snippets, transaction.run_many(self._statements.delete_turn, ids)

        return work

    def _update_batch_work(self, updates: list[dict[str, Any]]) -> Callable[[Transaction], int]:
        """Rewrite these turns' entity lists; how many."""

        def work(transaction: Transaction) -> int:
            transaction.run_many(self._statements.set_names, updates)
            return len(updates)

        return work

    def _forget_work(
        self, session_id: str, key: str, with_turns: bool, normalize: bool, done: _Done
    ) -> Callable[[Transaction], ForgetReceipt | None]:
        def work(transaction: Transaction) -> ForgetReceipt | None:
            found = self._entity_named(transaction, session_id, key)
            if not found and not with_turns:
                return None
            if not found:
                # Forgotten before without its turns: their texts may still name it.
                return self._forget_turns_only(transaction, session_id, key, normalize, done)
            entity = entity_record(found[0])
            transaction.count(
                self._identity.forget_judgements, {"session_id": session_id, "entity_id": entity.id}
            )
            self._erase_errors_naming(transaction, session_id, entity.key, normalize)
            if with_turns:
                return self._forget_with_turns(transaction, session_id, entity, normalize, done)
            updated = self._drop_name_from_turns(
                transaction, session_id, entity, normalize, done.after_id
            )
            snippets = self._delete_entity(transaction, session_id, entity)
            return ForgetReceipt(entity.name, 1, snippets, 0, updated + done.updated)

        return work

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
        self,
        transaction: Transaction,
        session_id: str,
        entity: EntityRecord,
        normalize: bool,
        done: _Done,
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
        mentioning = self._delete_turns_mentioning(
            transaction, session_id, keys, normalize, done.after_id
        )
        self._delete_entity(transaction, session_id, entity)
        orphans = self._delete_orphans(
            transaction,
            session_id,
            others | done.others,
            mentioning.names | done.names,
            normalize,
        )
        return ForgetReceipt(
            entity.name,
            1 + orphans,
            int(snippets) + mentioning.snippets + done.snippets,
            turns_deleted + mentioning.turns + done.turns,
            0,
        )

    def _forget_turns_only(
        self, transaction: Transaction, session_id: str, key: str, normalize: bool, done: _Done
    ) -> ForgetReceipt | None:
        """``with_turns`` for a name no entity has (any more): the turns whose text holds
        it, their snippets, and the entities known only from them. None if there are none."""
        self._erase_errors_naming(transaction, session_id, key, normalize)
        mentioning = self._delete_turns_mentioning(
            transaction, session_id, {key}, normalize, done.after_id
        )
        if not (mentioning.turns or done.turns):
            return None
        orphans = self._delete_orphans(
            transaction, session_id, set(done.others), mentioning.names | done.names, normalize
        )
        return ForgetReceipt(
            key,
            orphans,
            mentioning.snippets + done.snippets,
            mentioning.turns + done.turns,
            0,
        )

    def _turns_mentioning(
        self,
        transaction: Transaction,
        session_id: str,
        keys: set[str],
        normalize: bool,
        after_id: int,
    ) -> list[Any]:
        """The session's turns after ``after_id`` whose text holds one of ``keys`` as
        whole words."""
        patterns = [_whole_words(key, normalize) for key in keys if key]
        if not patterns:  # a name of no letters or digits mentions nothing
            return []
        values = {"session_id": session_id, "after_id": after_id}
        return [
            row
            for row in transaction.run(self._statements.session_turns, values)
            if any(
                pattern.search(_searchable(f"{row.input_text} {row.output_text}", normalize))
                for pattern in patterns
            )
        ]

    def _delete_turns_mentioning(
        self,
        transaction: Transaction,
        session_id: str,
        keys: set[str],
        normalize: bool,
        after_id: int = 0,
    ) -> _Mentioning:
        """Delete the session's turns (after ``after_id``) whose text holds one of
        ``keys`` as whole words, with their snippets (one parameter set per turn)."""
        found = _Mentioning()
        rows = self._turns_mentioning(transaction, session_id, keys, normalize, after_id)
        ids = [{"session_id": session_id, "turn_id": row.id} for row in rows]
        for row in rows:
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
        self,
        transaction: Transaction,
        session_id: str,
        entity: EntityRecord,
        normalize: bool,
        after_id: int = 0,
    ) -> int:
        of_entity = {"session_id": session_id, "entity_id": entity.id}
        rows = transaction.run(self._statements.turns_naming, {**of_entity, "after_id": after_id})
        aliases = transaction.run(self._identity.aliases_of, of_entity)
        keys = {entity.key, *(alias.alias_key for alias in aliases)}
        updates = _name_updates(session_id, rows, keys, normalize)
        transaction.run_many(self._statements.set_names, updates)
        return len(updates)


# Turns one transaction of a long erasure deletes or rewrites: a few tens of milliseconds
# on either backend, so that other sessions' saves (on SQLite, waiting for the one
# writer) never wait long.
ERASURE_BATCH = 500
# The longest pause between two batches on SQLite (seconds): longer than the longest sleep
# of its busy handler's polling (0.1 s), so that a waiting save gets the write lock.
BATCH_PAUSE = 0.2

_Step = tuple[Callable[[Transaction], Any], SessionLock | None]


class _RolledBack(Exception):
    """Raised at the end of a dry run's unit of work, carrying its receipt: the
    transaction rolls back."""

    def __init__(self, receipt: ForgetReceipt | None) -> None:
        super().__init__("dry run")
        self.receipt = receipt


def _rolled_back(
    work: Callable[[Transaction], ForgetReceipt | None],
) -> Callable[[Transaction], ForgetReceipt | None]:
    def run(transaction: Transaction) -> ForgetReceipt | None:
        raise _RolledBack(work(transaction))

    return run


@dataclass
class _Plan:
    """What a long erasure will reach, read before it begins (see the module)."""

    newest: int = 0
    turn_ids: set[int] = field(default_factory=set)
    updates: list[dict[str, Any]] = field(default_factory=list)
    others: set[int] = field(default_factory=set)
    names: set[str] = field(default_factory=set)


@dataclass
class _Done:
    """What the batches of a long erasure did, for its last unit of work and receipt."""

    after_id: int = 0
    turns: int = 0
    snippets: int = 0
    updated: int = 0
    others: set[int] = field(default_factory=set)
    names: set[str] = field(default_factory=set)

    def add(self, deleted: tuple[int, int]) -> None:
        self.snippets += deleted[0]
        self.turns += deleted[1]


def _chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    ordered = sorted(items, key=lambda item: item["turn_id"] if isinstance(item, dict) else item)
    for start in range(0, len(ordered), ERASURE_BATCH):
        yield ordered[start : start + ERASURE_BATCH]


def _name_updates(
    session_id: str, rows: list[Any], keys: set[str], normalize: bool
) -> list[dict[str, Any]]:
    """Each turn's entity list without the names whose key is one of ``keys``."""
    return [
        {
            "session_id": session_id,
            "turn_id": row.id,
            "names": [
                name for name in row.entity_names if name_key(name, normalize=normalize) not in keys
            ],
        }
        for row in rows
    ]


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
