"""The statements of pruning, compiled once per store: fixed shapes, bounded batches."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.driver import CompiledStatement, compile_statement
from ..db.schema import contexts, entities, in_same_session, turns
from ..turns.queries import param, session_param
from .policies import cutoff_case


def _limited(ids: Any) -> Any:
    return ids.limit(param("batch")).scalar_subquery()


class PruneStatements:
    """The pruner's statements, compiled for one dialect (the ones that filter by entity
    type once per number of types)."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        # Every statement names the session of each table it reads, subqueries too: Citus
        # then runs it on the session's shard alone.
        in_session = turns.c.session_id == session_param()
        snippets_in_session = contexts.c.session_id == session_param()
        entities_in_session = entities.c.session_id == session_param()
        old_turns = _limited(
            sa.select(turns.c.id)
            .where(in_session, turns.c.created_at < param("turn_cutoff", sa.Double))
            .order_by(turns.c.id)
        )
        self.count_turn_snippets = self._compiled(
            sa.select(sa.func.count().label("count")).where(
                snippets_in_session, contexts.c.turn_id.in_(old_turns)
            )
        )
        self.delete_old_turns = self._compiled(
            turns.delete().where(in_session, turns.c.id.in_(old_turns))
        )
        of_entity = sa.and_(snippets_in_session, contexts.c.entity_id == param("entity_id"))
        self.boundary = self._compiled(
            sa.select(contexts.c.turn_seq, contexts.c.id)
            .where(of_entity)
            .order_by(contexts.c.turn_seq.desc(), contexts.c.id.desc())
            .offset(param("keep"))
            .limit(1)
        )
        at_or_before = sa.tuple_(contexts.c.turn_seq, contexts.c.id) <= sa.tuple_(
            param("turn_seq"), param("id")
        )
        self.count_beyond = self._compiled(
            sa.select(sa.func.count().label("count")).where(of_entity, at_or_before)
        )
        self.delete_beyond = self._compiled(
            contexts.delete().where(
                snippets_in_session,
                contexts.c.id.in_(
                    _limited(
                        sa.select(contexts.c.id)
                        .where(of_entity, at_or_before)
                        .order_by(contexts.c.turn_seq, contexts.c.id)
                    )
                ),
            )
        )
        self.entity_page = self._compiled(
            sa.select(entities.c.id, entities.c.entity_type)
            .where(entities_in_session, entities.c.id > param("after"))
            .order_by(entities.c.id)
            .limit(param("limit"))
        )
        has_snippet = sa.exists().where(
            snippets_in_session,
            in_same_session(contexts.c.entity_id, entities.c.id),
        )
        self.delete_orphans = self._compiled(
            entities.delete().where(
                entities_in_session,
                entities.c.id.in_(
                    _limited(
                        sa.select(entities.c.id)
                        .where(entities_in_session, ~has_snippet)
                        .order_by(entities.c.id)
                    )
                ),
            )
        )
        self._old_snippets: dict[int, CompiledStatement] = {}

    def _compiled(self, statement: Any) -> CompiledStatement:
        return compile_statement(statement, self._dialect)

    def delete_old_snippets(self, types: int) -> CompiledStatement:
        """Delete up to ``:batch`` snippets older than their entity type's cutoff."""
        statement = self._old_snippets.get(types)
        if statement is None:
            old = (
                sa.select(contexts.c.id)
                .join(
                    entities,
                    in_same_session(entities.c.id, contexts.c.entity_id),
                )
                .where(
                    contexts.c.session_id == session_param(),
                    contexts.c.created_at < cutoff_case(entities.c.entity_type, types),
                )
                .order_by(contexts.c.id)
            )
            statement = self._compiled(
                contexts.delete().where(
                    contexts.c.session_id == session_param(), contexts.c.id.in_(_limited(old))
                )
            )
            self._old_snippets[types] = statement
        return statement
