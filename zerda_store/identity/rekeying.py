"""Re-keying what the previous release saved during a rolling deploy (``zerda-store db
rekey``, the contract step's data work).

Between ``db upgrade`` and the moment the last server of the previous release stops, those
servers keep saving: their entities take the key their release makes (fold-v1, or the name
as written) and no core (``core_key`` is empty). Re-keying gives each such entity the key
and core of its session's rules; one whose key is another entity's under those rules
(the previous release did not find "Müller" under its new key) is merged into that entity
through the merge log (reason "key rules"), so that ``unmerge`` can undo it.

Online and resumable: one short transaction per session, holding the session's lock
exclusively (its saves wait for it, the other sessions' do not); what is done stays done,
and a run that stops is finished by the next, which finds only the entities still without
a core.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..db.execution.pacing import WriterPacing
from ..db.execution.unit_of_work import SessionLock, Transaction
from ..db.store import Store, StoreCore, core_of
from ..model.names import EXACT, FOLD_V2, KEY_RULES, KeyRules
from .merging import KEY_RULES_REASON, merge
from .rules import identify
from .statements import IdentityStatements


@dataclass
class SessionRekeyed:
    """What re-keying did to one session (the shape of ``db upgrade``'s report)."""

    session_id: str
    key_rules: str
    unsure: bool = False
    rekeyed: int = 0
    merges: list[dict[str, Any]] = field(default_factory=list)


class Rekeying:
    """Re-keys, session by session, the entities saved without a core."""

    def __init__(
        self, store: Store | StoreCore, *, assume_normalized: bool | Collection[str] = False
    ) -> None:
        self.store = core_of(store)
        self.assume_normalized = assume_normalized
        self._statements = self.store.statements(IdentityStatements)

    def pending(self) -> list[str]:
        """The sessions holding entities without a core, by session id."""
        rows = self.store.read(
            lambda transaction: transaction.run(self._statements.unkeyed_sessions, {})
        )
        return sorted(row.session_id for row in rows)

    def without_effect(self, sessions: Collection[str]) -> dict[str, str]:
        """Of the sessions named as written with ``normalize_names=True``, those for which
        saying so would change nothing, each with why: a session with no entity to
        re-key (none by that id: misspelt?), or one whose key rules are recorded."""

        def work(transaction: Transaction) -> dict[str, str]:
            pending = {
                row.session_id for row in transaction.run(self._statements.unkeyed_sessions, {})
            }
            reasons = {}
            for session_id in sorted(sessions):
                recorded = transaction.run(self._statements.rules_of, {"session_id": session_id})
                if recorded:
                    reasons[session_id] = (
                        f"its key rules are recorded already ({recorded[0].key_rules})"
                    )
                elif session_id not in pending:
                    reasons[session_id] = "it has no entity to re-key (is the id misspelt?)"
            return reasons

        return self.store.read(work)

    def run(self, now: Callable[[], float]) -> Iterator[SessionRekeyed]:
        """Re-key every pending session, one transaction each, yielding what each got; on
        SQLite with pauses between them, in which waiting saves get the write lock
        (:mod:`..db.execution.pacing`)."""
        pacing = WriterPacing(self.store.dialect)
        for session_id in self.pending():
            began = time.monotonic()
            done = self.rekey(session_id, now())
            pacing.after(time.monotonic() - began)
            yield done

    def rekey(self, session_id: str, at: float) -> SessionRekeyed:
        """Re-key one session's entities saved without a core (one transaction)."""

        def work(transaction: Transaction) -> SessionRekeyed:
            values = {"session_id": session_id}
            # Locked in key order before they are read (see ``merging``): a save of the
            # previous release, which takes no session lock, then lands wholly before
            # the re-keying or wholly after it.
            transaction.run(self._statements.lock_session_entities, values)
            rows = transaction.run(self._statements.unkeyed_entities, values)
            rules, unsure = self._rules(transaction, session_id, rows, at)
            done = SessionRekeyed(session_id, rules.name, unsure)
            for row in rows:
                self._rekey_entity(transaction, row, rules, at, done)
            return done

        result: SessionRekeyed = self.store.write(work, SessionLock(session_id, exclusive=True))
        return result

    def _rules(
        self, transaction: Transaction, session_id: str, rows: list[Any], at: float
    ) -> tuple[KeyRules, bool]:
        """The session's recorded rules; for a session the previous release began, the
        rules its keys prove (a key that is not its name: fold-v1, re-keyed with fold-v2),
        else exact unless the operator says it was normalised. Recorded now."""
        recorded = transaction.run(self._statements.rules_of, {"session_id": session_id})
        if recorded:
            return KEY_RULES[recorded[0].key_rules], False
        assumed = self.assume_normalized is True or (
            not isinstance(self.assume_normalized, bool) and session_id in self.assume_normalized
        )
        proven = any(row.name_key != row.name for row in rows)
        rules = FOLD_V2 if proven or assumed else EXACT
        transaction.count(
            self._statements.record_rules,
            {"session_id": session_id, "key_rules": rules.name, "created_at": at},
        )
        return rules, not (proven or assumed)

    def _rekey_entity(
        self, transaction: Transaction, row: Any, rules: KeyRules, at: float, done: SessionRekeyed
    ) -> None:
        identity = identify(row.name, rules)
        key = identity.key or row.name_key  # a name of punctuation alone keeps its key
        statements = self._statements
        holder = transaction.run(
            statements.entity_by_key, {"session_id": row.session_id, "key": key}
        )
        if holder and holder[0].id != row.id:
            merged = row._replace(core_key=identity.core)
            receipt = merge(
                transaction, statements, holder[0], merged, reason=KEY_RULES_REASON, at=at,
                alias=False,
            )  # fmt: skip
            done.merges.append(
                {"merge_id": receipt.merge_id, "kept": receipt.kept, "merged": receipt.merged}
            )
            return
        core = identity.core or key
        values = {
            "session_id": row.session_id,
            "entity_id": row.id,
            "name_key": key,
            "core_key": core,
        }
        transaction.count(statements.set_key, values)
        done.rekeyed += 1
