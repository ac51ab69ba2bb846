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
from typing import Any

from ..db.execution.driver import Runnable
from ..db.execution.pipeline import write_pipelined
from ..db.execution.unit_of_work import SessionLock, SessionLockStatements, Transaction
from ..db.sharding import Sharding, distributed
from ..db.statistics import analyze_after
from ..db.store import Store
from ..identity.resolution import KnownKeyRules, check_key_rules, refuse_other_rules
from ..model.names import KeyRules
from ..model.records import NewTurn
from .attachment import Attachment, insert_turns
from .reads import Reads
from .rows import new_outcome_row, new_turn_row
from .single_trip import SingleTripSave


class Repository(Reads):
    """Saves and reads of one store's memories (one per memory; the statements are the
    store's): the saves here, the reads in :class:`reads.Reads`."""

    def __init__(self, store: Store, rules: KeyRules | None = None) -> None:
        super().__init__(store, rules)
        self._known = store.statements(KnownKeyRules).checked
        self._single_trip = (
            store.statements(SingleTripSave)
            if store.dialect == "postgresql" and rules is not None
            else None
        )

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
        already used in this session. On Postgres, a turn whose names need no resolution
        is saved in one round trip (:mod:`single_trip`)."""
        one_trip = self.one_trip_save(session_id, turn)
        if one_trip is not None:
            resolved, turn_id = one_trip()
            if resolved:
                return turn_id
        return self.store.write(*self.save_turn_work(session_id, turn))

    def one_trip_save(
        self, session_id: str, turn: NewTurn
    ) -> Callable[[], tuple[bool, int | None]] | None:
        """The turn saved in one round trip, when it may be (Postgres not distributed by
        Citus, the session's key rules checked in this store, names that need no
        resolution), else None; tried before :meth:`save_turn_work` by the sync save and
        the async one alike."""
        if not self._single_trip_fits(session_id):
            return None
        return lambda: self._save_in_one_trip(session_id, turn)

    def _single_trip_fits(self, session_id: str, *, reading: bool = True) -> bool:
        """On Postgres not distributed by Citus (there the statement runs in parts,
        :mod:`db.sharding`), once the session's rules are checked. ``reading=False``: only
        if Citus's absence is known already (it is read once per store)."""
        if self._single_trip is None or self._checked_rules(session_id) is not _nothing:
            return False
        if reading:
            return not self._distributed()
        return self.store.statements(Sharding).distributed is False

    def _distributed(self) -> bool:
        """Whether Citus distributes the tables (then every insert goes as VALUES)."""
        if self.store.dialect != "postgresql":
            return False
        found = distributed(self.store)
        if found:
            self._statements.route_inserts()
        return found

    def _save_in_one_trip(self, session_id: str, turn: NewTurn) -> tuple[bool, int | None]:
        """The turn saved by one statement after the session's lock, in one pipeline:
        (True, its id, or None for an idempotency key used before); (False, None), with
        nothing written, when its names need resolution."""
        return one_trip_outcome(write_pipelined(self.store, self._one_trip_steps(session_id, turn)))

    def one_trip_steps(self, session_id: str, turn: NewTurn) -> list[tuple[Runnable, Any]] | None:
        """The statements of the turn's one-trip save (for :func:`one_trip_outcome`) when it
        is known without a read that it fits (the async path sends them from the event
        loop); else None."""
        if not self._single_trip_fits(session_id, reading=False):
            return None
        return self._one_trip_steps(session_id, turn)

    def _one_trip_steps(self, session_id: str, turn: NewTurn) -> list[tuple[Runnable, Any]]:
        assert self._single_trip is not None
        lock = self.store.statements(SessionLockStatements).shared
        return [
            (lock, {"session_id": session_id}),
            (self._single_trip.statement, SingleTripSave.values(session_id, turn)),
        ]

    def save_turn_work(
        self, session_id: str, turn: NewTurn
    ) -> tuple[Callable[[Transaction], int | None], SessionLock]:
        """The unit of work of one saved turn, its statements prepared, and its lock
        (:meth:`save_turn`, and the async path's)."""
        self._distributed()
        marked_turn = self._statements.marked_turn
        insert_turn = self._statements.turn.prepare(1) if marked_turn is None else None
        attachment = Attachment(self._statements, [turn], self._resolver)
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

        return work, SessionLock(session_id)

    def save_turns(self, session_id: str, new_turns: Sequence[NewTurn]) -> list[int]:
        """Store many turns in one transaction, as a loop of :meth:`save_turn` would; a bulk
        of them leaves the tables analysed (:mod:`db.statistics`)."""
        if not new_turns:
            return []
        self._distributed()
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

        saved_ids = self.store.write(work, SessionLock(session_id))
        analyze_after(self.store, len(saved_ids))
        return saved_ids

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
