"""The statements of pruning, compiled once per store: fixed shapes, bounded batches."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.execution.driver import CompiledStatement
from ..db.execution.statements import Statements, dialect_insert, param, session_param
from ..db.schema import contexts, entities, in_same_session, retention_policies, turns
from .policy import cutoff_case


def _limited(ids: Any) -> Any:
    return ids.limit(param("batch")).scalar_subquery()


class PruneStatements(Statements):
    """The pruner's statements, compiled for one dialect (the ones that filter by entity
    type once per number of types)."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
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
        self.count_turn_snippets = self.compiled(
            sa.select(sa.func.count().label("count")).where(
                snippets_in_session, contexts.c.turn_id.in_(old_turns)
            )
        )
        self.delete_old_turns = self.compiled(
            turns.delete().where(in_session, turns.c.id.in_(old_turns))
        )
        of_entity = sa.and_(snippets_in_session, contexts.c.entity_id == param("entity_id"))
        self.boundary = self.compiled(
            sa.select(contexts.c.turn_seq, contexts.c.id)
            .where(of_entity)
            .order_by(contexts.c.turn_seq.desc(), contexts.c.id.desc())
            .offset(param("keep"))
            .limit(1)
        )
        at_or_before = sa.tuple_(contexts.c.turn_seq, contexts.c.id) <= sa.tuple_(
            param("turn_seq"), param("id")
        )
        self.count_beyond = self.compiled(
            sa.select(sa.func.count().label("count")).where(of_entity, at_or_before)
        )
        self.delete_beyond = self.compiled(
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
        self.entity_page = self.compiled(
            sa.select(entities.c.id, entities.c.entity_type)
            .where(entities_in_session, entities.c.id > param("after"))
            .order_by(entities.c.id)
            .limit(param("limit"))
        )
        has_snippet = sa.exists().where(
            snippets_in_session,
            in_same_session(contexts.c.entity_id, entities.c.id),
        )
        self.delete_orphans = self.compiled(
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

    def delete_old_snippets(self, types: int) -> CompiledStatement:
        """Delete up to ``:batch`` snippets older than their entity type's cutoff."""

        def build() -> CompiledStatement:
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
            return self.compiled(
                contexts.delete().where(
                    contexts.c.session_id == session_param(), contexts.c.id.in_(_limited(old))
                )
            )

        return self.per_count(types, build)


class PolicyStatements(Statements):
    """The policy table's statements, compiled for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        compiled = self.compiled

        table = retention_policies
        scope = table.c.session_id == session_param()
        self.rules = compiled(
            sa.select(
                table.c.session_id,
                table.c.entity_type,
                table.c.keep_last,
                table.c.max_age,
                table.c.session_idle,
            ).where(sa.or_(scope, table.c.session_id == param("default_scope", sa.String)))
        )
        insert = dialect_insert(dialect.name)(table).values(
            session_id=session_param(),
            entity_type=param("entity_type", sa.String),
            keep_last=param("keep_last"),
            max_age=param("max_age", sa.Double),
            session_idle=param("session_idle", sa.Double),
            updated_at=param("updated_at", sa.Double),
        )
        self.set_rule = compiled(
            insert.on_conflict_do_update(
                index_elements=[table.c.session_id, table.c.entity_type],
                set_={
                    column: insert.excluded[column]
                    for column in ("keep_last", "max_age", "session_idle", "updated_at")
                },
            )
        )
        self.any_rule = compiled(sa.select(sa.exists(sa.select(table.c.session_id)).label("found")))
        self.clear_rules = compiled(table.delete().where(scope))
        self.clear_rule = compiled(
            table.delete().where(scope, table.c.entity_type == param("entity_type", sa.String))
        )
        newest_turn = (
            sa.select(turns.c.created_at)
            .where(turns.c.session_id == session_param())
            .order_by(turns.c.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        last_seen = (
            sa.select(sa.func.max(entities.c.last_seen))
            .where(entities.c.session_id == session_param())
            .scalar_subquery()
        )
        self.last_activity = compiled(
            sa.select(newest_turn.label("turn_at"), last_seen.label("entity_at"))
        )
