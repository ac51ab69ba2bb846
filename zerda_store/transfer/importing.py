"""Importing exported records into a session: one unit of work that holds the session's
lock exclusively, so that its refuse-if-not-empty check and its writes cannot be raced by
another import, a copy or a save.

Rows are built by the same builders as a save's (:mod:`rows`); a turn whose idempotency
key the session has used is found by the insert itself (``ON CONFLICT DO NOTHING``), not by
a list of keys, so no parameter limit applies however many turns the file holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.execution.driver import compile_statement
from ..db.execution.statements import custom_plans, session_param
from ..db.execution.unit_of_work import SessionLock, Transaction
from ..db.schema import entities, turns
from ..db.sharding import distributed
from ..db.statistics import analyze_after
from ..db.store import StoreCore
from ..errors import SessionNotEmptyError
from ..identity.resolution import check_key_rules
from ..identity.statements import IdentityStatements
from ..model.names import KeyRules
from ..turns.statements import RowsInsert, TurnStatements
from .writing import SessionWriter


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
        # A turn of the session saved at the same time with the same texts: the file (or an
        # export of the same session) was merged in before.
        self.same_turn = compile_statement(
            sa.select(turns.c.id)
            .where(
                turns.c.session_id == session_param(),
                turns.c.created_at == sa.bindparam("created_at", type_=turns.c.created_at.type),
                turns.c.input_text == sa.bindparam("input_text", type_=turns.c.input_text.type),
                turns.c.output_text == sa.bindparam("output_text", type_=turns.c.output_text.type),
            )
            .limit(1),
            dialect,
        )
        # Postgres: every statement of the import's transaction planned for its own values,
        # the foreign-key checks of its rows included. A check's plan is otherwise made once
        # per connection and kept; made while a new database's tables were nearly empty, it
        # may read every turn of the session so far by the session alone (a copy of 100,000
        # turns into a new database then read about 5·10⁹ index entries).
        self.custom_plans = custom_plans(dialect)


class Importer:
    def __init__(self, store: StoreCore) -> None:
        self.store = store
        self._statements = store.statements(ImportStatements)
        self._turn_statements = store.statements(TurnStatements)

    def session_exists(self, session_id: str) -> bool:
        values = {"session_id": session_id}
        rows = self.store.read(lambda t: t.run(self._statements.session_exists, values))
        return bool(rows[0].found)

    def import_session(
        self,
        session_id: str,
        records: Iterable[dict[str, Any]],
        *,
        merge: bool = False,
        key_rules: KeyRules | None = None,
        analyze: bool = True,
    ) -> dict[str, int]:
        """Write exported records (turns, then entities, then snippets, as an export orders
        them) into a session in one transaction, mapping ids, ``IMPORT_BATCH`` rows a
        statement, so memory stays flat in the session's size. ``records`` must be
        re-iterable (a list, or an object whose ``__iter__`` starts over): a unit of work
        that meets a deadlock or a lost connection runs again from the start. Entities that
        already exist in the session (a merge) are upserted as a saved turn would be.
        Nothing is written if the session holds data and ``merge`` is false, or if a turn's
        idempotency key was used in the session before. With ``key_rules`` (the rules the
        file's keys were made with, or fold-v2 for an older file's fold-v1 keys) the
        session is recorded as keyed with them (refused if it is keyed otherwise), and
        the entities are keyed with them. A bulk import leaves the tables analysed
        (:mod:`db.statistics`), unless ``analyze`` is false (a copy analyses once at its end)."""
        inserts = (
            self._statements.turns,
            self._turn_statements.entities,
            self._turn_statements.contexts,
            self._turn_statements.outcomes,
        )
        routed = distributed(self.store)  # Citus: VALUES only, each routed whole
        for insert in inserts:
            if routed:
                insert.route()
            insert.compile_all()
        exists = self._statements.session_exists
        identity = self.store.statements(IdentityStatements)

        custom_plans = self._statements.custom_plans

        def work(transaction: Transaction) -> dict[str, int]:
            if custom_plans is not None:
                transaction.run(custom_plans)
            if not merge and transaction.run(exists, {"session_id": session_id})[0].found:
                raise SessionNotEmptyError(
                    f"session {session_id!r} already holds data: pass --merge to add to it"
                )
            if key_rules is not None:
                check_key_rules(transaction, identity, session_id, key_rules, time.time())
            writer = SessionWriter(transaction, session_id, *inserts)
            writer.keyed(key_rules, identity, merging=merge, same_turn=self._statements.same_turn)
            for kind, batch in _batches(records):
                writer.write(kind, batch)
            return writer.counts

        counts = self.store.write(work, SessionLock(session_id, exclusive=True))
        if analyze:
            analyze_after(self.store, sum(counts.values()))
        return counts


IMPORT_BATCH = 512


def _batches(records: Iterable[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Runs of records of one kind, at most ``IMPORT_BATCH`` long."""
    kind = ""
    batch: list[dict[str, Any]] = []
    for record in records:
        if record["kind"] != kind or len(batch) == IMPORT_BATCH:
            if batch:
                yield kind, batch
            kind, batch = record["kind"], []
        batch.append(record)
    if batch:
        yield kind, batch
