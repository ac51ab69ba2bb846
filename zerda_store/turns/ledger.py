"""The extraction ledger: which turns' extraction failed, and their repair.

A repaired turn gets its entities and snippets in its own place (its id orders them), as
if extraction had worked the first time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.execution.driver import compile_statement
from ..db.execution.statements import param, session_param
from ..db.execution.unit_of_work import SessionLock, Transaction
from ..db.schema import extractions, in_same_session, turns
from ..db.store import StoreCore
from ..identity.resolution import Resolver
from ..model.records import Mention, NewTurn, Outcome, PendingTurn
from .attachment import Attachment
from .rows import ledger_values, pending_turn
from .statements import TurnStatements


class LedgerStatements:
    """The ledger's statements, compiled for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        def compiled(statement: Any) -> Any:
            return compile_statement(statement, dialect)

        failed = (
            sa.select(
                turns.c.id,
                turns.c.session_id,
                turns.c.input_text,
                turns.c.output_text,
                turns.c.created_at,
            )
            .join(
                extractions,
                in_same_session(extractions.c.turn_id, turns.c.id),
            )
            .where(extractions.c.status == "failed")
            .order_by(turns.c.id)
        )
        self.failed = compiled(failed)
        self.failed_in_session = compiled(failed.where(extractions.c.session_id == session_param()))
        # The session in every statement of a turn: Citus runs each on its shard alone.
        ledger_of_turn = sa.and_(
            extractions.c.session_id == session_param(), extractions.c.turn_id == param("turn_id")
        )
        waiting = sa.select(extractions.c.id).where(
            ledger_of_turn, extractions.c.status == "failed"
        )
        # Postgres: the row stays locked until the repair commits (SQLite, which has one
        # writer, compiles no FOR UPDATE).
        self.waiting = compiled(waiting.with_for_update())
        self.set_names = compiled(
            turns.update()
            .where(turns.c.session_id == session_param(), turns.c.id == param("turn_id"))
            .values(entity_names=param("names", turns.c.entity_names.type))
        )
        ledger = {
            "extractor": param("extractor", sa.String),
            "status": param("status", sa.String),
            "error": param("error", sa.Text),
            "latency_ms": param("latency_ms", sa.Double),
            "entity_count": param("entity_count"),
            "updated_at": param("updated_at", sa.Double),
        }
        self.record_attempt = compiled(
            extractions.update()
            .where(ledger_of_turn)
            .values(attempts=extractions.c.attempts + 1, **ledger)
        )


class Ledger:
    """The extraction ledger of one store."""

    def __init__(self, store: StoreCore, resolver: Resolver | None = None) -> None:
        self.store = store
        self._statements = store.statements(LedgerStatements)
        self._turn_statements = store.statements(TurnStatements)
        # A repaired turn's mentions join entities as a save's do (aliases, titled forms).
        self._resolver = resolver

    def failed_turns(self, session_id: str | None = None) -> list[PendingTurn]:
        """Turns whose extraction failed, in turn order (of one session, or of all)."""
        return [pending_turn(row) for row in self.store.read(self._failed(session_id))]

    async def afailed_turns(self, session_id: str | None = None) -> list[PendingTurn]:
        """:meth:`failed_turns`, awaited."""
        return [pending_turn(row) for row in await self.store.aread(self._failed(session_id))]

    def _failed(self, session_id: str | None) -> Callable[[Transaction], list[Any]]:
        if session_id is None:
            statement, values = self._statements.failed, {}
        else:
            statement, values = self._statements.failed_in_session, {"session_id": session_id}
        return lambda transaction: transaction.run(statement, values)

    def repair_turn(
        self, turn: PendingTurn, mentions: Sequence[Mention], outcome: Outcome, at: float
    ) -> bool:
        """Record a new extraction of a failed turn; if it worked, attach its entities and
        snippets in the turn's own place. False if the turn is no longer waiting (another
        process repaired it, or it was deleted)."""
        return self.store.write(*self._repair(turn, mentions, outcome, at))

    async def arepair_turn(
        self, turn: PendingTurn, mentions: Sequence[Mention], outcome: Outcome, at: float
    ) -> bool:
        """:meth:`repair_turn`, awaited."""
        return await self.store.awrite(*self._repair(turn, mentions, outcome, at))

    def _repair(
        self, turn: PendingTurn, mentions: Sequence[Mention], outcome: Outcome, at: float
    ) -> tuple[Callable[[Transaction], bool], SessionLock]:
        statements = self._statements
        rebuilt = NewTurn(turn.input_text, turn.output_text, mentions, turn.created_at)
        attach = outcome.status == "ok" and bool(mentions)
        attachment = Attachment(self._turn_statements, [rebuilt] if attach else [], self._resolver)
        of_turn = {"session_id": turn.session_id, "turn_id": turn.id}
        attempt = {**of_turn, **ledger_values(outcome, len(mentions), at)}

        def work(transaction: Transaction) -> bool:
            if not transaction.run(statements.waiting, of_turn):
                return False
            if attach:
                attachment.run(transaction, turn.session_id, [(turn.id, rebuilt)])
                names = [mention.name for mention in mentions]
                transaction.count(statements.set_names, {**of_turn, "names": names})
            transaction.count(statements.record_attempt, attempt)
            return True

        return work, SessionLock(turn.session_id)
