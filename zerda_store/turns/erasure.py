"""Erasure: forgetting one entity, and clearing a session.

Each ends in one unit of work holding its session's lock exclusively (SQLite's single
writer does the same), so that it covers every turn committed before it. No statement
carries a list of ids: ids found in Python go one parameter set at a time. An erasure
that reaches more than ``ERASURE_BATCH`` turns is planned in a read without a lock, done
in batches of short transactions (other sessions' saves never wait for more than one),
then finished by that last unit of work, which reads only the turns saved since the plan
(:mod:`erasure_plan`). An interrupted one is finished by running it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import Any

from ..db.execution.unit_of_work import SessionLock, Transaction
from ..db.store import StoreCore
from ..identity.statements import IdentityStatements
from ..model.names import name_key
from ..model.records import EntityRecord, ForgetReceipt
from . import erasure_plan
from .erasure_plan import (
    Done,
    Mentioning,
    Plan,
    RolledBack,
    Step,
    chunks,
    delete_batch_work,
    name_updates,
    pause_after,
    rolled_back,
    searchable,
    turns_mentioning,
    update_batch_work,
    whole_words,
)
from .erasure_statements import ERASED_ERROR, ErasureStatements
from .queries import Queries
from .rows import entity_record

__all__ = ["ERASED_ERROR", "Erasure"]


class Erasure:
    """Forgetting entities and clearing sessions of one store."""

    def __init__(self, store: StoreCore) -> None:
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
        (``with_turns``: those turns, their snippets, and the other entities of those turns
        left with no snippet); in batches past ``ERASURE_BATCH`` turns (see the module).
        ``dry_run``: the receipt, the erasure done in one transaction rolled back."""
        if dry_run:
            work = self._forget_work(session_id, key, with_turns, normalize, Done())
            try:
                self.store.write(rolled_back(work), SessionLock(session_id, exclusive=True))
            except RolledBack as undone:
                return undone.receipt
        steps, store = self._forget_steps(session_id, key, with_turns, normalize), self.store
        done: Any = None
        pause = 0.0
        while True:
            try:
                work, lock = steps.send(done)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
            time.sleep(pause)  # the waiting saves' turn, between two batches (SQLite)
            began = time.monotonic()
            done = store.write(work, lock) if lock else store.read(work, snapshot=True)
            pause = pause_after(store.dialect, lock, time.monotonic() - began)

    async def aforget_entity(
        self, session_id: str, key: str, *, with_turns: bool, normalize: bool, dry_run: bool = False
    ) -> ForgetReceipt | None:
        """:meth:`forget_entity`, awaited."""
        if dry_run:
            work = self._forget_work(session_id, key, with_turns, normalize, Done())
            try:
                await self.store.awrite(rolled_back(work), SessionLock(session_id, exclusive=True))
            except RolledBack as undone:
                return undone.receipt
        steps, store = self._forget_steps(session_id, key, with_turns, normalize), self.store
        done: Any = None
        pause = 0.0
        while True:
            try:
                work, lock = steps.send(done)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
            await asyncio.sleep(pause)
            began = time.monotonic()
            done = await (store.awrite(work, lock) if lock else store.aread(work, snapshot=True))
            pause = pause_after(store.dialect, lock, time.monotonic() - began)

    def _forget_steps(
        self, session_id: str, key: str, with_turns: bool, normalize: bool
    ) -> Generator[Step, Any, ForgetReceipt | None]:
        """An erasure's units of work, each sent the last one's result: a plan, its
        batches, then the last unit of work."""
        lock = SessionLock(session_id, exclusive=True)
        plan: Plan = yield self._plan_work(session_id, key, with_turns, normalize), None
        done = Done()
        if len(plan.turn_ids) + len(plan.updates) > erasure_plan.ERASURE_BATCH:
            for batch in chunks(plan.turn_ids):
                done.add((yield delete_batch_work(self._statements, session_id, batch), lock))
            for updates in chunks(plan.updates):
                done.updated += yield update_batch_work(self._statements, updates), lock
            done.after_id = plan.newest
            done.others, done.names = plan.others, plan.names
        work = self._forget_work(session_id, key, with_turns, normalize, done)
        receipt: ForgetReceipt | None = yield work, lock
        return receipt

    def _plan_work(
        self, session_id: str, key: str, with_turns: bool, normalize: bool
    ) -> Callable[[Transaction], Plan]:
        """What an erasure will reach, read without a lock: the turns it deletes (or whose
        entity lists it rewrites), the other entities they name, and the newest turn."""

        def work(transaction: Transaction) -> Plan:
            plan = Plan()
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
                    plan.updates = name_updates(session_id, naming, keys, normalize)
                    return plan
                plan.turn_ids = {row.id for row in naming}
                plan.others = {
                    row.entity_id
                    for row in transaction.run(self._statements.named_alongside, of_entity)
                }
            mentioning = turns_mentioning(
                transaction, self._statements, session_id, keys, normalize, 0
            )
            plan.turn_ids.update(row.id for row in mentioning)
            plan.names.update(name for row in mentioning for name in row.entity_names)
            return plan

        return work

    def _forget_work(
        self, session_id: str, key: str, with_turns: bool, normalize: bool, done: Done
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
        done: Done,
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
        self, transaction: Transaction, session_id: str, key: str, normalize: bool, done: Done
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

    def _delete_turns_mentioning(
        self,
        transaction: Transaction,
        session_id: str,
        keys: set[str],
        normalize: bool,
        after_id: int = 0,
    ) -> Mentioning:
        """Delete the session's turns (after ``after_id``) whose text holds one of
        ``keys`` as whole words, with their snippets (one parameter set per turn)."""
        rows = turns_mentioning(
            transaction, self._statements, session_id, keys, normalize, after_id
        )
        ids = [{"session_id": session_id, "turn_id": row.id} for row in rows]
        found = Mentioning(names={name for row in rows for name in row.entity_names})
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
        pattern = whole_words(key, normalize)
        naming = [
            {"session_id": session_id, "ledger_id": row.id}
            for row in rows
            if pattern.search(searchable(row.error, normalize))
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
        updates = name_updates(session_id, rows, keys, normalize)
        transaction.run_many(self._statements.set_names, updates)
        return len(updates)
