"""The statements of erasure (:mod:`erasure`), compiled once per dialect."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.execution.statements import Statements, param, session_param
from ..db.schema import (
    contexts,
    entities,
    entity_aliases,
    entity_merges,
    extractions,
    in_same_session,
    turns,
)

# What an extraction error that named a forgotten entity reads afterwards.
ERASED_ERROR = "(error text erased: it named a forgotten entity)"


class ErasureStatements(Statements):
    """The statements of erasure, compiled for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        compiled = self.compiled

        # Every statement names the session of each table it reads, subqueries too, so that
        # Citus runs it on the session's shard alone.
        entity = param("entity_id")
        snippets_in_session = contexts.c.session_id == session_param()
        turns_in_session = turns.c.session_id == session_param()
        turns_of_entity = sa.select(contexts.c.turn_id).where(
            snippets_in_session, contexts.c.entity_id == entity, contexts.c.turn_id.is_not(None)
        )
        later = turns.c.id > param("after_id")
        self.turns_naming = compiled(
            sa.select(turns.c.id, turns.c.entity_names).where(
                turns_in_session, later, turns.c.id.in_(turns_of_entity)
            )
        )
        self.newest_turn = compiled(
            sa.select(sa.func.coalesce(sa.func.max(turns.c.id), 0).label("id")).where(
                turns_in_session
            )
        )
        self.set_names = compiled(
            turns.update()
            .where(turns_in_session, turns.c.id == param("turn_id"))
            .values(entity_names=param("names", turns.c.entity_names.type))
        )
        self.count_snippets_with_turns = compiled(
            sa.select(sa.func.count().label("count")).where(
                snippets_in_session,
                sa.or_(contexts.c.entity_id == entity, contexts.c.turn_id.in_(turns_of_entity)),
            )
        )
        # Their snippets and ledger rows go with them (ON DELETE CASCADE).
        self.delete_turns_naming = compiled(
            turns.delete().where(
                turns.c.session_id == session_param(), turns.c.id.in_(turns_of_entity)
            )
        )
        self.delete_turn = compiled(
            turns.delete().where(turns_in_session, turns.c.id == param("turn_id"))
        )
        self.session_turns = compiled(
            sa.select(
                turns.c.id, turns.c.input_text, turns.c.output_text, turns.c.entity_names
            ).where(turns_in_session, later)
        )
        self.delete_turn_snippets = compiled(
            contexts.delete().where(snippets_in_session, contexts.c.turn_id == param("turn_id"))
        )
        self.delete_snippets = compiled(
            contexts.delete().where(snippets_in_session, contexts.c.entity_id == entity)
        )
        entity_in_session = sa.and_(
            entities.c.session_id == session_param(), entities.c.id == entity
        )
        self.delete_entity = compiled(entities.delete().where(entity_in_session))
        self.named_alongside = compiled(
            sa.select(contexts.c.entity_id)
            .where(
                snippets_in_session,
                contexts.c.turn_id.in_(turns_of_entity),
                contexts.c.entity_id != entity,
            )
            .distinct()
        )
        has_snippets = sa.exists().where(
            snippets_in_session,
            in_same_session(contexts.c.entity_id, entities.c.id),
        )
        self.delete_if_orphan = compiled(entities.delete().where(entity_in_session, ~has_snippets))
        self.errors_in_session = compiled(
            sa.select(extractions.c.id, extractions.c.error).where(
                extractions.c.session_id == session_param(), extractions.c.error.is_not(None)
            )
        )
        self.erase_error = compiled(
            extractions.update()
            .where(
                extractions.c.session_id == session_param(), extractions.c.id == param("ledger_id")
            )
            .values(error=ERASED_ERROR)
        )
        # The merge log holds names and snippet texts: it goes with what it logged.
        self.clear = [
            compiled(table.delete().where(table.c.session_id == session_param()))
            for table in (contexts, extractions, entity_aliases, entity_merges, entities, turns)
        ]
        self.forget_merges = compiled(
            entity_merges.delete().where(
                entity_merges.c.session_id == session_param(),
                sa.or_(
                    entity_merges.c.kept_entity_id == entity,
                    entity_merges.c.merged_entity_id == entity,
                ),
            )
        )
