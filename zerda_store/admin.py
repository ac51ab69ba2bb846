"""The operators' queries: session and entity listings, export, import and copy.

Kept apart from :mod:`repository`, which serves the chat turn's hot path. Listings and
exports are ad-hoc reads and go through SQLAlchemy (:meth:`Store.query`); imports are one
unit of work holding the session's lock exclusively, with their refuse-if-not-empty check
inside it (:mod:`importing`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from .db.schema import (
    ANY_SCOPE,
    contexts,
    entities,
    entity_aliases,
    entity_merges,
    turns,
)
from .db.statistics import analyze_after
from .db.store import Store, StoreCore, core_of
from .errors import SessionNotEmptyError
from .model.names import KeyRules
from .model.records import PendingTurn
from .retention.carrying import carried_policy, carry_default, record_carried
from .retention.policies import Policies
from .retention.policy import describe, make_rule, type_scope
from .retention.pruning import Pruner
from .telemetry.operations import UPDATE, counts, observed, observed_records, session_argument
from .transfer.exporting import export_session
from .transfer.importing import Importer
from .turns.ledger import Ledger
from .turns.listing import EntitySummary, Listings, SessionSummary
from .turns.repository import Repository
from .validation import checked_entity_type, checked_identifier, checked_name, checked_session_id

# The input rules an operator's arguments are checked by as the command line parses them
# (a session id, a name, an entity type), each taking the value and what to call it.
ARGUMENT_RULES: dict[str, Callable[[object, str], str]] = {
    "session id": checked_identifier,
    "name": checked_name,
    "entity type": checked_entity_type,
}


@dataclass(frozen=True)
class CopyReport:
    copied: int
    skipped: int
    # Retention rules carried: the default's (to a destination without one) and sessions'.
    default_rules: int = 0
    session_rules: int = 0


class AdminRepository:
    """The operators' queries over one store."""

    def __init__(self, store: Store | StoreCore) -> None:
        self.store = core_of(store)
        self._importer = Importer(self.store)

    def sessions(self, *, include_expired: bool = False) -> list[SessionSummary]:
        """Every session that holds turns or entities that show (under a retention policy,
        a session of which everything expired is not listed), by session id;
        ``include_expired``: every session that holds rows, with the counts stored."""
        return Listings(self.store).sessions(include_expired=include_expired)

    def session_ids(self, *, include_expired: bool = False) -> list[str]:
        """The ids of :meth:`sessions` (``include_expired``: of every session that holds
        turns or entities, expired or not)."""
        if not include_expired:
            return [s.session_id for s in self.sessions()]
        return Listings(self.store).session_ids()

    def row_counts(self, session_ids: Iterable[str]) -> int:
        """How many records an export of these sessions holds (turns, entities, snippets,
        aliases): the total of a progress bar, counted in one snapshot per table."""
        wanted = list(session_ids)
        total = 0
        with self.store.query() as connection:
            for table in (turns, entities, contexts, entity_aliases):
                counted = sa.select(sa.func.count()).where(table.c.session_id.in_(wanted))
                total += connection.execute(counted).scalar_one() if wanted else 0
        return total

    def entity_summaries(self, session_id: str) -> list[EntitySummary]:
        """The session's entities with their snippet counts, in first-seen order, as the
        reads show them (under a retention policy, without what it has expired)."""
        return Listings(self.store).entity_summaries(session_id)

    def export_session(
        self, session_id: str, *, include_expired: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Every row of a session as plain records, from one snapshot: turns with their
        ledger rows, entities in first-seen order, then snippets in each entity's order.
        Ids are the source database's and serve only as references between records. What
        the session's retention policy has expired is left out unless ``include_expired``
        (decided just before the snapshot: :func:`transfer.exporting.export_session`)."""
        records = export_session(self.store, session_id, include_expired=include_expired)
        return observed_records(self.store, "export_session", session_id, records)

    # -- retention ------------------------------------------------------------------------

    def set_retention(
        self,
        session_id: str | None,
        keep_last: int | None = None,
        max_age: timedelta | float | None = None,
        session_idle: timedelta | float | None = None,
        *,
        entity_type: str | None = None,
        merge: bool = False,
    ) -> dict[str, Any]:
        """Set a session's rule, or the default's (``session_id=None``), for every entity
        type or for one (see :meth:`ConversationEntityMemory.set_retention`); the rule as
        stored. ``merge=True`` keeps the stored rule's fields that are not given here
        (setting ``max_age`` alone then keeps an earlier ``keep_last``)."""
        kind = type_scope(entity_type)
        policies = Policies(self.store)
        stored = policies.stored(_scope(session_id)).get(kind) if merge else None
        if stored is not None:
            keep_last = stored.keep_last if keep_last is None else keep_last
            max_age = stored.max_age if max_age is None else max_age
            session_idle = stored.session_idle if session_idle is None else session_idle
        rule = make_rule(keep_last, max_age, session_idle)
        policies.set(_scope(session_id), kind, rule, time.time())
        return rule.as_dict()

    def retention(self, session_id: str | None) -> dict[str, Any]:
        """The rules stored for a session (``session_id=None``: the default), as
        :func:`retention.describe` gives them, plus ``effective`` for a session: the
        policy that applies to it (its own, else the default)."""
        policies = Policies(self.store)
        stored = policies.stored(_scope(session_id))
        general = stored.pop(ANY_SCOPE, None)
        shown: dict[str, Any] = {
            "scope": "default" if session_id is None else session_id,
            **(
                general.as_dict()
                if general
                else {k: None for k in ("keep_last", "max_age", "session_idle")}
            ),
            "by_type": {t: rule.as_dict() for t, rule in sorted(stored.items())},
        }
        if session_id is not None:
            shown["effective"] = describe(policies.effective(session_id), session_id)
        return shown

    def carried_policy(self, session_id: str) -> dict[str, Any]:
        """The retention rules an export of ``session_id`` carries: the session's own and
        the default's (:mod:`retention.carrying`)."""
        return carried_policy(self.store, checked_session_id(session_id))

    def record_carried(self, session_id: str, carried: dict[str, Any]) -> dict[str, Any]:
        """Give an imported session the policy it had at its source (see
        :func:`retention.carrying.record_carried`); what was done."""
        return record_carried(self.store, checked_session_id(session_id), carried)

    def clear_retention(self, session_id: str | None, *, entity_type: str | None = None) -> int:
        """Delete a session's (or the default's) rules, or one entity type's; how many."""
        kind = None if entity_type is None else type_scope(entity_type)
        return Policies(self.store).clear(_scope(session_id), kind)

    def prune(self, session_id: str | None = None, *, dry_run: bool = False) -> dict[str, int]:
        """Prune one session, or every session a policy applies to (see
        :class:`pruning.Pruner`); the counts deleted (or, ``dry_run``, to be deleted)."""
        pruner = Pruner(self.store)
        if session_id is None:
            return pruner.prune_all(dry_run=dry_run).as_dict()
        return pruner.prune(checked_session_id(session_id), dry_run=dry_run).as_dict()

    def sessions_holding_data(self, session_ids: Iterable[str]) -> set[str]:
        """Those of ``session_ids`` that hold turns or entities (one query a table; a
        schema of any revision has both tables)."""
        wanted = sorted(set(session_ids))
        found: set[str] = set()
        if not wanted:
            return found
        with self.store.query() as connection:
            for table in (turns, entities):
                query = sa.select(table.c.session_id).where(table.c.session_id.in_(wanted))
                found.update(connection.execute(query.distinct()).scalars())
        return found

    def merges_by_reason(self, reason: str) -> list[dict[str, Any]]:
        """Every session's merges of one reason ("key rules": those the upgrades and
        ``db rekey`` made; "manual"; "confirmed same"), by session then oldest first, undone
        ones too: ``session_id``, ``merge_id``, ``kept``, ``merged``, ``reason``,
        ``created_at``, ``undone_at``."""
        log = entity_merges.c
        query = (
            sa.select(
                log.session_id, log.id, log.kept_name, log.merged_name, log.reason,
                log.created_at, log.undone_at,
            )
            .where(log.reason == reason)
            .order_by(log.session_id, log.id)
        )  # fmt: skip
        with self.store.query() as connection:
            return [
                {
                    "session_id": row.session_id,
                    "merge_id": int(row.id),
                    "kept": row.kept_name,
                    "merged": row.merged_name,
                    "reason": row.reason,
                    "created_at": float(row.created_at),
                    "undone_at": row.undone_at,
                }
                for row in connection.execute(query)
            ]

    def session_exists(self, session_id: str) -> bool:
        return self._importer.session_exists(session_id)

    def failed_turns(self, session_id: str | None = None) -> list[PendingTurn]:
        """Turns whose extraction failed (of one session, or of all)."""
        return Ledger(self.store).failed_turns(session_id)

    @observed(UPDATE, session=session_argument, done=counts)
    def import_session(
        self,
        session_id: str,
        records: Iterable[dict[str, Any]],
        *,
        merge: bool = False,
        key_rules: KeyRules | None = None,
        analyze: bool = True,
    ) -> dict[str, int]:
        """Write exported records into a session in one transaction (see
        :meth:`Importer.import_session`); without ``merge`` a session that holds data is
        refused with :class:`SessionNotEmptyError`. A bulk import leaves the tables
        analysed unless ``analyze`` is false."""
        return self._importer.import_session(
            session_id, records, merge=merge, key_rules=key_rules, analyze=analyze
        )

    def key_rules(self, session_id: str) -> KeyRules | None:
        """The key rules the session was keyed with (None if none is recorded)."""
        return Repository(self.store).key_rules(session_id)

    @observed(UPDATE, done=counts)
    def copy_to(
        self,
        target: Store | StoreCore,
        session_ids: Iterable[str] | None = None,
        rows: Callable[[Iterable[dict[str, Any]]], Iterable[dict[str, Any]]] = lambda r: r,
        *,
        include_expired: bool = False,
    ) -> CopyReport:
        """Copy sessions (default: all) into ``target``, each in one transaction. Sessions
        that already hold data there are skipped, so an interrupted copy can be run again,
        and two copies running at once store each session once. ``rows`` wraps each
        session's records as they stream (a progress bar counts them). What a retention
        policy has expired is not copied unless ``include_expired``. A bulk copy leaves
        ``target``'s tables analysed, once, at its end."""
        ids = (
            list(session_ids)
            if session_ids is not None
            else self.session_ids(include_expired=include_expired)
        )
        target = core_of(target)
        destination = AdminRepository(target)
        copied = skipped = written = session_rules = 0
        default_rules = carry_default(self.store, target)
        for session_id in ids:
            try:
                counts = destination.import_session(
                    session_id,
                    rows(_Export(self, session_id, include_expired)),
                    key_rules=self.key_rules(session_id),
                    analyze=False,
                )
            except SessionNotEmptyError:
                skipped += 1
                continue
            copied += 1
            written += sum(counts.values())
            carried = destination.record_carried(session_id, self.carried_policy(session_id))
            session_rules += carried["retention_rules"]
        analyze_after(target, written)
        return CopyReport(copied, skipped, default_rules, session_rules)


def _scope(session_id: str | None) -> str:
    return ANY_SCOPE if session_id is None else checked_session_id(session_id)


class _Export:
    """A session's records as an export gives them, streamed again on every iteration."""

    def __init__(self, source: AdminRepository, session_id: str, include_expired: bool) -> None:
        self._source = source
        self._session_id = session_id
        self._include_expired = include_expired

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._source.export_session(self._session_id, include_expired=self._include_expired)
