"""The memory's repository: saving turns (here) and reading them back (:mod:`reads`). It
speaks in plain values and small records; its SQL is built in :mod:`statements` and
:mod:`queries` and compiled once per store.

Every write is one unit of work (:meth:`Store.write`) whose statements are compiled
before it begins; a save takes its session's lock shared, so that erasure, clear and
import (which take it exclusively, :mod:`erasure`, :mod:`admin`) see every save committed
before them. Entity upserts take their keys in sorted order so that two turns naming the
same entities cannot deadlock each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..db.connections.settings import milliseconds
from ..db.execution.unit_of_work import SessionLock, Transaction
from ..db.routes import OneTrip, Save
from ..db.statistics import analyze_after
from ..db.store import StoreCore
from ..identity.resolution import KnownKeyRules, check_key_rules, refuse_other_rules
from ..model.names import KeyRules
from ..model.records import NewTurn
from .attachment import Attachment, insert_turns
from .delegated import DelegatedCalls
from .reads import Reads
from .rows import new_outcome_row, new_turn_row
from .single_trip import SingleTripSave


class Repository(Reads):
    """Saves and reads of one store's memories (one per memory; the statements are the
    store's): the saves here, the reads in :class:`reads.Reads`."""

    def __init__(self, store: StoreCore, rules: KeyRules | None = None) -> None:
        super().__init__(store, rules)
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

    def key_rules_check(self, session_id: str) -> Callable[[Transaction], None] | None:
        """What a read or a change by name runs first (None once done in this store): the
        session's recorded key rules must be this repository's, else a name keyed
        otherwise would silently find nothing. A session with none recorded takes any."""
        rules = self._rules
        if rules is None or (session_id, rules.name) in self._known:
            return None
        statement = self._identity.rules_of

        def check(transaction: Transaction) -> None:
            rows = transaction.run(statement, {"session_id": session_id})
            refuse_other_rules(session_id, rows[0].key_rules if rows else None, rules)
            if rows:
                self._remember_rules(session_id)

        return check

    def _remember_rules(self, session_id: str) -> None:
        if self._rules is not None:
            self._known.add((session_id, self._rules.name))

    # -- writes -------------------------------------------------------------------------

    def save_turn(self, session_id: str, turn: NewTurn) -> int | None:
        """Store one turn with its entities and snippets; None if its idempotency key was
        already used in this session. The store's routes choose how (:mod:`db.routes`)."""
        return self.routes.save(self.turn_save(session_id, turn))

    def turn_save(self, session_id: str, turn: NewTurn) -> Save[int | None]:
        """What saving one turn writes, for the sync save and the async one alike: its unit
        of work, and the one statement it may be instead (:mod:`single_trip`) once the
        session's key rules are checked in this store."""
        rules = self._rules
        one_trip = None
        if rules is not None and (session_id, rules.name) in self._known:
            one_trip = partial(self._one_trip, session_id, turn)
        return Save(session_id, partial(self._turn_unit, session_id, turn), one_trip)

    def _one_trip(self, session_id: str, turn: NewTurn, delegated: bool) -> OneTrip[int | None]:
        """The single-trip statement, or (Citus) the call of the function that runs it on
        the session's worker (:mod:`delegated`): the same values (with the new rows' ids,
        read first from the coordinator's sequences), the same row."""
        values = SingleTripSave.values(session_id, turn)
        if not delegated:
            statement = self.store.statements(SingleTripSave).statement
            return OneTrip(statement, values, one_trip_outcome)
        calls = self.store.statements(DelegatedCalls)
        values["lock_timeout_ms"] = milliseconds(self.store.lock_timeout)
        ids = (calls.ids, {"count": len(turn.mentions)})
        return OneTrip(calls.save, values, one_trip_outcome, first=ids, here=calls.save_here)

    def _turn_unit(
        self, session_id: str, turn: NewTurn, routed: bool
    ) -> Callable[[Transaction], int | None]:
        """The unit of work of one saved turn, its statements prepared (``routed``: inserts
        as VALUES, :meth:`TurnStatements.route_inserts`)."""
        if routed:
            self._statements.route_inserts()
        marked_turn = self._statements.marked_turn
        insert_turn = self._statements.turn.prepare(1) if marked_turn is None else None
        attachment = Attachment(self._statements, [turn], self._resolver, by_probe=not routed)
        insert_outcome = self._statements.outcomes.prepare(1)
        turn_row = new_turn_row(session_id, turn)
        check_rules = self._checked_rules(session_id)

        def work(transaction: Transaction) -> int | None:
            check_rules(transaction, turn.created_at)
            if marked_turn is not None:  # SQLite: the session's mark comes with the id
                inserted = transaction.run(marked_turn, turn_row)
            else:
                assert insert_turn is not None
                inserted = insert_turn.run(transaction, [turn_row])
            if not inserted:
                return None
            turn_id = int(inserted[0].id)
            possible = marked_turn is None or bool(inserted[0].resolution_possible)
            attachment.run(transaction, session_id, [(turn_id, turn)], resolution_possible=possible)
            insert_outcome.run(transaction, [new_outcome_row(session_id, turn_id, turn)])
            self._remember_rules(session_id)
            return turn_id

        return work

    def save_turns(self, session_id: str, new_turns: Sequence[NewTurn]) -> list[int]:
        """Store many turns in one transaction, as a loop of :meth:`save_turn` would; a bulk
        of them leaves the tables analysed (:mod:`db.statistics`)."""
        if not new_turns:
            return []
        saved_ids = self.routes.save(
            Save(session_id, partial(self._turns_unit, session_id, new_turns))
        )
        analyze_after(self.store, len(saved_ids))
        return saved_ids

    def _turns_unit(
        self, session_id: str, new_turns: Sequence[NewTurn], routed: bool
    ) -> Callable[[Transaction], list[int]]:
        if routed:
            self._statements.route_inserts()
        insert = self._statements.turns.prepare(len(new_turns))
        attachment = Attachment(self._statements, new_turns, self._resolver, by_probe=not routed)
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

        return work

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


def _nothing(_transaction: Transaction, _at: float) -> None:
    return None


def one_trip_outcome(rows: list[Any]) -> tuple[bool, int | None]:
    """What a one-trip save's rows say: (True, the turn's id, or None for an idempotency
    key used before), or (False, None) when its names need resolution (nothing written)."""
    [row] = rows
    if row.resolution_needed:
        return False, None
    return True, None if row.turn_id is None else int(row.turn_id)
