"""Pruning: deleting what the retention policies expired, in bounded batches.

Each batch is its own unit of work that holds its session's lock exclusively (on
Postgres; SQLite's single writer does the same) only while it deletes at most
``batch_size`` rows, so saves wait for one batch at most. Every batch deletes what the
policy says must go *now*, whatever earlier batches did: a prune interrupted at any point
finishes when run again, and its receipts add up to one uninterrupted run's.

The steps, for a session with a policy: (1) turns older than the turn age, with their
snippets and ledger rows (ON DELETE CASCADE); (2) snippets older than their entity type's
age; (3) beyond each entity's newest ``keep_last``; (4) entities left with no snippet. A
session idle past ``session_idle`` expires whole: steps 1, 2 and 4 with every cutoff at
the idle cutoff, so a turn saved while the expiry runs stays. A dry run counts the same
in one snapshot and deletes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa

from ..db.execution.unit_of_work import Transaction
from ..db.schema import ANY_SCOPE, contexts, entities, in_same_session, retention_policies, turns
from ..db.statistics import analyze_if_never_analysed
from ..db.store import StoreCore
from ..telemetry.operations import DELETE, counts, note_pruned, observed, session_argument
from .policies import Policies
from .policy import Clock, Visibility, session_lock
from .statements import PruneStatements

logger = logging.getLogger("zerda_store.pruning")

BATCH_SIZE = 1_000
ENTITY_PAGE = 500


@dataclass
class PruneReceipt:
    """What a prune deleted (or, for a dry run, would delete)."""

    sessions: int = 0
    turns: int = 0
    snippets: int = 0
    entities: int = 0

    def add(self, other: PruneReceipt) -> None:
        self.sessions += other.sessions
        self.turns += other.turns
        self.snippets += other.snippets
        self.entities += other.entities

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Pruner:
    """Applies the retention policies of one store. ``now`` is the clock policies are
    measured by (injectable for tests); ``batch_size`` bounds every transaction."""

    def __init__(
        self, store: StoreCore, *, now: Clock = time.time, batch_size: int = BATCH_SIZE
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.store = store
        self.now = now
        self.batch_size = batch_size
        self.policies = Policies(store)
        self._statements = store.statements(PruneStatements)
        # Whether the tables were looked at for missing statistics (once per pruner).
        self._statistics_checked = False

    def sessions_with_policies(self) -> list[str]:
        """Every session a policy applies to: all of them if there is a default policy."""
        with self.store.query() as connection:
            scopes = set(
                connection.execute(sa.select(retention_policies.c.session_id).distinct()).scalars()
            )
            if ANY_SCOPE not in scopes:
                return sorted(scopes)
            found = sa.union(
                sa.select(turns.c.session_id), sa.select(entities.c.session_id)
            ).subquery()
            return sorted(connection.execute(sa.select(found.c.session_id)).scalars())

    @observed(DELETE, done=counts)
    def prune_all(self, *, dry_run: bool = False) -> PruneReceipt:
        """Prune every session a policy applies to; the receipts summed."""
        total = PruneReceipt()
        for session_id in self.sessions_with_policies():
            total.add(self.prune(session_id, dry_run=dry_run))
        return total

    @observed(DELETE, session=session_argument, done=counts)
    def prune(self, session_id: str, *, dry_run: bool = False) -> PruneReceipt:
        """Prune one session by its policy (nothing without one)."""
        policy = self.policies.effective(session_id)
        if policy is None or not policy.limits_anything:
            return PruneReceipt()
        visible = self.policies.visibility(session_id, policy, self.now())
        if dry_run:
            counted = self._count(session_id, visible)
            note_pruned(self.store, session_id, counted, dry_run=True)
            return counted
        if not self._statistics_checked:
            self._statistics_checked = True
            analyze_if_never_analysed(self.store)
        receipt = PruneReceipt(sessions=int(visible.idle_expired))
        receipt.add(self._old_turns(session_id, visible))
        receipt.snippets += self._old_snippets(session_id, visible)
        if not visible.idle_expired:
            receipt.snippets += self._beyond_keep_last(session_id, visible)
        receipt.entities += self._orphans(session_id)
        note_pruned(self.store, session_id, receipt, dry_run=False)
        return receipt

    # -- the steps ------------------------------------------------------------------------

    def _batches(self, session_id: str, work: Callable[[Transaction], int]) -> int:
        """Run ``work`` (one batch) until it deletes less than a full batch; the total."""
        total = 0
        while True:
            deleted = self.store.write(work, session_lock(session_id))
            total += deleted
            if deleted < self.batch_size:
                return total

    def _old_turns(self, session_id: str, visible: Visibility) -> PruneReceipt:
        if visible.turn_cutoff == -float("inf"):
            return PruneReceipt()
        statements = self._statements
        values = {
            "session_id": session_id,
            "turn_cutoff": visible.turn_cutoff,
            "batch": self.batch_size,
        }
        receipt = PruneReceipt()

        def work(transaction: Transaction) -> tuple[int, int]:
            snippets = transaction.run(statements.count_turn_snippets, values)[0].count
            return transaction.count(statements.delete_old_turns, values), int(snippets)

        # Counted once the batch committed: an attempt run again (a deadlock) counts once.
        while True:
            deleted, snippets = self.store.write(work, session_lock(session_id))
            receipt.turns += deleted
            receipt.snippets += snippets
            if deleted < self.batch_size:
                return receipt

    def _old_snippets(self, session_id: str, visible: Visibility) -> int:
        cutoffs = [visible.cutoff, *(cutoff for _, cutoff in visible.type_cutoffs)]
        if all(cutoff == -float("inf") for cutoff in cutoffs):
            return 0
        statement = self._statements.delete_old_snippets(len(visible.type_cutoffs))
        values = {"session_id": session_id, "batch": self.batch_size, **visible.cutoff_values()}
        return self._batches(session_id, lambda t: t.count(statement, values))

    def _beyond_keep_last(self, session_id: str, visible: Visibility) -> int:
        """Per entity: the snippets older than its ``keep_last``-th newest, in batches that
        gather several entities up to ``batch_size`` rows."""
        pending: list[dict[str, Any]] = []
        pending_rows = total = 0
        for entity_id, boundary, beyond in self._entities_beyond(session_id, visible):
            values = {
                "session_id": session_id,
                "entity_id": entity_id,
                "turn_seq": boundary[0],
                "id": boundary[1],
            }
            if beyond >= self.batch_size:  # one entity's long tail: its own batches
                total += self._delete_beyond(session_id, [values])
                continue
            pending.append(values)
            pending_rows += beyond
            if pending_rows >= self.batch_size:
                total += self._delete_beyond(session_id, pending)
                pending, pending_rows = [], 0
        if pending:
            total += self._delete_beyond(session_id, pending)
        return total

    def _entities_beyond(
        self, session_id: str, visible: Visibility
    ) -> Iterable[tuple[int, tuple[int, int], int]]:
        """Entities with snippets beyond their ``keep_last``: id, the newest snippet to
        delete (turn_seq, id), and how many to delete."""
        after = 0
        while True:
            values = {"session_id": session_id, "after": after, "limit": ENTITY_PAGE}
            page = self._page(values)
            for row in page:
                keep = visible.keep_last(row.entity_type)
                if keep is None:
                    continue
                found = self._read_boundary(session_id, row.id, keep)
                if found is not None:
                    yield row.id, found[0], found[1]
            if len(page) < ENTITY_PAGE:
                return
            after = page[-1].id

    def _page(self, values: dict[str, Any]) -> list[Any]:
        statement = self._statements.entity_page
        return self.store.read(lambda transaction: transaction.run(statement, values))

    def _read_boundary(
        self, session_id: str, entity_id: int, keep: int
    ) -> tuple[tuple[int, int], int] | None:
        of_entity = {"session_id": session_id, "entity_id": entity_id}
        return self.store.read(lambda transaction: self._boundary(transaction, of_entity, keep))

    def _boundary(
        self, transaction: Transaction, of_entity: dict[str, Any], keep: int
    ) -> tuple[tuple[int, int], int] | None:
        statements = self._statements
        rows = transaction.run(statements.boundary, {**of_entity, "keep": keep})
        if not rows:
            return None
        values = {**of_entity, "turn_seq": rows[0].turn_seq, "id": rows[0].id}
        count = transaction.run(statements.count_beyond, values)[0].count
        return (rows[0].turn_seq, rows[0].id), int(count)

    def _delete_beyond(self, session_id: str, entities_values: list[dict[str, Any]]) -> int:
        """Delete each entity's snippets at or before its boundary; an entity whose tail
        is longer than a batch takes several."""
        statement = self._statements.delete_beyond
        batch = [{**values, "batch": self.batch_size} for values in entities_values]
        if len(batch) == 1:
            return self._batches(session_id, lambda t: t.count(statement, batch[0]))

        def work(transaction: Transaction) -> int:
            return sum(transaction.count(statement, values) for values in batch)

        return self.store.write(work, session_lock(session_id))

    def _orphans(self, session_id: str) -> int:
        values = {"session_id": session_id, "batch": self.batch_size}
        statement = self._statements.delete_orphans
        return self._batches(session_id, lambda t: t.count(statement, values))

    # -- the dry run ----------------------------------------------------------------------

    def _count(self, session_id: str, visible: Visibility) -> PruneReceipt:
        """What :meth:`prune` would delete now, counted in one snapshot."""
        entity_type = entities.c.entity_type
        expired = sa.or_(
            contexts.c.created_at < _case(entity_type, visible),
            sa.and_(turns.c.id.is_not(None), turns.c.created_at < visible.turn_cutoff),
        )
        recency = sa.func.row_number().over(
            partition_by=contexts.c.entity_id,
            order_by=(contexts.c.turn_seq.desc(), contexts.c.id.desc()),
        )
        survivors = (
            sa.select(contexts.c.entity_id, entity_type, recency.label("recency"))
            .join(
                entities,
                in_same_session(entities.c.id, contexts.c.entity_id),
            )
            .outerjoin(
                turns,
                in_same_session(turns.c.id, contexts.c.turn_id),
            )
            .where(contexts.c.session_id == session_id, ~expired)
            .subquery()
        )
        keep = _keep_case(survivors.c.entity_type, visible)
        within = sa.true() if keep is None else sa.or_(keep.is_(None), survivors.c.recency <= keep)
        kept = sa.select(
            sa.func.count().label("snippets"),
            sa.func.count(sa.distinct(survivors.c.entity_id)).label("entities"),
        ).where(within)
        with self.store.query() as connection:
            total_turns, total_snippets, total_entities = (
                connection.execute(
                    sa.select(sa.func.count()).where(table.c.session_id == session_id)
                ).scalar_one()
                for table in (turns, contexts, entities)
            )
            old_turns = connection.execute(
                sa.select(sa.func.count()).where(
                    turns.c.session_id == session_id, turns.c.created_at < visible.turn_cutoff
                )
            ).scalar_one()
            kept_row = connection.execute(kept).one()
        return PruneReceipt(
            sessions=int(visible.idle_expired and (total_turns + total_entities) > 0),
            turns=int(old_turns),
            snippets=int(total_snippets - kept_row.snippets),
            entities=int(total_entities - kept_row.entities),
        )


def _case(entity_type: Any, visible: Visibility) -> Any:
    """The snippet cutoff by entity type, as literals (the dry run is an ad-hoc query)."""
    if not visible.type_cutoffs:
        return sa.literal(visible.cutoff, sa.Double)
    whens = [(entity_type == t, sa.literal(c, sa.Double)) for t, c in visible.type_cutoffs]
    return sa.case(*whens, else_=sa.literal(visible.cutoff, sa.Double))


def _keep_case(entity_type: Any, visible: Visibility) -> Any:
    """``keep_last`` by entity type (NULL: no limit), or None if nothing is limited."""
    policy = visible.policy
    default = policy.general.keep_last
    whens = [
        (entity_type == t, sa.literal(policy.keep_last(t), sa.Integer))
        for t in sorted(policy.by_type)
        if policy.keep_last(t) is not None
    ]
    if visible.idle_expired or (default is None and not whens):
        return None
    fallback = sa.literal(default, sa.Integer) if default is not None else sa.null()
    return sa.case(*whens, else_=fallback) if whens else fallback
