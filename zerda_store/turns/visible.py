"""The reads of a session that has a retention policy: the same reads as
:mod:`queries`, hiding what the policy has expired but the pruner has not yet deleted.

Used only when a policy applies; without one, reads run :mod:`queries`' statements
unchanged. Snippets carry their creation time out (the repository drops expired ones and
cuts each entity at ``keep_last``); counts and listings filter in SQL, by a cutoff per
entity type (:func:`retention.cutoff_case`), compiled once per number of types.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.execution.statements import Statements, param, session_param
from ..db.schema import contexts, entities, in_same_session, listed_first_seen, turns
from ..retention.policy import cutoff_case
from .queries import FIRST_SEEN_ORDER, TurnReads
from .statements import ENTITY_SELECT, NEWEST_FIRST


class VisibleQueries(Statements):
    """The policy-aware reads, compiled for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        of_entity = sa.and_(
            contexts.c.session_id == session_param(), contexts.c.entity_id == param("entity_id")
        )
        aged = (contexts.c.text, contexts.c.created_at)
        self.recent_contexts = self.compiled(
            sa.select(*aged).where(of_entity).order_by(*NEWEST_FIRST).limit(param("limit"))
        )
        self.all_contexts = self.compiled(
            sa.select(*aged).where(of_entity).order_by(contexts.c.turn_seq, contexts.c.id)
        )
        self.count_contexts = self.compiled(
            sa.select(sa.func.count().label("count")).where(
                of_entity, contexts.c.created_at >= param("cutoff", sa.Double)
            )
        )
        recent = turns.c.created_at >= param("turn_cutoff", sa.Double)
        self.turn_reads = TurnReads(
            self.compiled, sa.and_(turns.c.session_id == session_param(), recent)
        )

    def typed(self, count: int) -> _TypedReads:
        """The reads that filter by a cutoff per entity type, for ``count`` types."""
        return self.per_count(count, lambda: _TypedReads(self.compiled, count))


class _TypedReads:
    def __init__(self, compiled: Any, count: int) -> None:
        # The session as a constant in the subquery too: Citus routes it to one shard then.
        has_visible = (
            sa.exists()
            .where(
                contexts.c.session_id == session_param(),
                in_same_session(contexts.c.entity_id, entities.c.id),
            )
            .where(contexts.c.created_at >= cutoff_case(entities.c.entity_type, count))
        )
        in_session = entities.c.session_id == session_param()
        page = sa.select(*ENTITY_SELECT, *FIRST_SEEN_ORDER[:2]).where(
            in_session, listed_first_seen(), has_visible
        )
        self.entities_first_page = compiled(page.order_by(*FIRST_SEEN_ORDER).limit(param("limit")))
        after = sa.tuple_(*FIRST_SEEN_ORDER) > sa.tuple_(
            param("turn"), param("position"), param("id")
        )
        self.entities_next_page = compiled(
            page.where(after).order_by(*FIRST_SEEN_ORDER).limit(param("limit"))
        )
        self.count_entities = compiled(
            sa.select(sa.func.count().label("count"))
            .select_from(entities)
            .where(in_session, has_visible)
        )
        # Visible snippets per entity (the repository cuts each at its keep_last).
        self.snippet_counts = compiled(
            sa.select(
                contexts.c.entity_id.label("entity_id"),
                entities.c.entity_type,
                sa.func.count().label("count"),
            )
            .select_from(contexts)
            .join(
                entities,
                in_same_session(entities.c.id, contexts.c.entity_id),
            )
            .where(
                contexts.c.session_id == session_param(),
                contexts.c.created_at >= cutoff_case(entities.c.entity_type, count),
            )
            .group_by(contexts.c.entity_id, entities.c.entity_type)
        )
