"""The memory's fixed-shape statements besides the chat turn's: reads of entities, snippets
and turns, and the note added with ``Entity.add_context``. Built from
:mod:`zerda_store.db.schema` and compiled once per store; no I/O here.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.execution.statements import Statements, param, session_param
from ..db.schema import contexts, entities, listed_first_seen, turns
from .statements import ENTITY_SELECT, NEWEST_FIRST

FIRST_SEEN_ORDER = (entities.c.first_turn_id, entities.c.first_position, entities.c.id)
TURN_COLUMNS = (turns.c.id, turns.c.input_text, turns.c.output_text, turns.c.entity_names)


def count_in_session(table: sa.Table) -> Any:
    return (
        sa.select(sa.func.count())
        .select_from(table)
        .where(table.c.session_id == session_param())
        .scalar_subquery()
    )


class TurnReads:
    """Reads of a session's turns (those ``where`` picks), compiled: pages in saved order or
    newest first, found by offset or after the id of the last turn seen, and a count."""

    def __init__(self, compiled: Any, where: Any) -> None:
        turns_from = sa.select(*TURN_COLUMNS).where(where)
        self.count = compiled(
            sa.select(sa.func.count().label("count")).select_from(turns).where(where)
        )
        self.page = compiled(
            turns_from.order_by(turns.c.id).offset(param("offset")).limit(param("limit"))
        )
        self.newest_first = compiled(
            turns_from.order_by(turns.c.id.desc()).offset(param("offset")).limit(param("limit"))
        )
        self.after = compiled(
            turns_from.where(turns.c.id > param("after")).order_by(turns.c.id).limit(param("limit"))
        )
        self.before = compiled(
            turns_from.where(turns.c.id < param("before"))
            .order_by(turns.c.id.desc())
            .limit(param("limit"))
        )


class Queries(Statements):
    """The statements, compiled for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        compiled = self.compiled

        in_session = entities.c.session_id == session_param()
        of_entity = sa.and_(
            contexts.c.session_id == session_param(), contexts.c.entity_id == param("entity_id")
        )
        self.entity_by_key = compiled(
            sa.select(*ENTITY_SELECT).where(
                in_session, entities.c.name_key == param("key", sa.String)
            )
        )
        self.turn_by_key = compiled(
            sa.select(turns.c.id).where(
                turns.c.session_id == session_param(),
                turns.c.idempotency_key == param("idempotency_key", sa.String),
            )
        )
        self.count_contexts = compiled(sa.select(sa.func.count().label("count")).where(of_entity))
        self.recent_contexts = compiled(
            sa.select(contexts.c.text)
            .where(of_entity)
            .order_by(*NEWEST_FIRST)
            .limit(param("limit"))
        )
        self.all_contexts = compiled(
            sa.select(contexts.c.text).where(of_entity).order_by(contexts.c.turn_seq, contexts.c.id)
        )
        page = sa.select(*ENTITY_SELECT, *FIRST_SEEN_ORDER[:2]).where(
            in_session, listed_first_seen()
        )
        self.entities_first_page = compiled(page.order_by(*FIRST_SEEN_ORDER).limit(param("limit")))
        after = sa.tuple_(*FIRST_SEEN_ORDER) > sa.tuple_(
            param("turn"), param("position"), param("id")
        )
        self.entities_next_page = compiled(
            page.where(after).order_by(*FIRST_SEEN_ORDER).limit(param("limit"))
        )
        self.count_entities = compiled(sa.select(count_in_session(entities).label("count")))
        self.stats = compiled(
            sa.select(
                count_in_session(entities).label("entity_count"),
                count_in_session(turns).label("message_count"),
                count_in_session(contexts).label("total_contexts"),
            )
        )
        self.turn_reads = TurnReads(compiled, turns.c.session_id == session_param())
        self.count_turns = self.turn_reads.count
        self._notes(compiled)

    def _notes(self, compiled: Any) -> None:
        """``Entity.add_context``: a snippet of no turn, ordered after every turn of its
        session so far."""
        of_entity = sa.and_(
            entities.c.session_id == session_param(), entities.c.id == param("entity_id")
        )
        newest_turn = (
            sa.select(sa.func.coalesce(sa.func.max(turns.c.id), 0))
            .where(turns.c.session_id == session_param())
            .scalar_subquery()
        )
        # The newest turn is read here, not inside the INSERT: Citus takes no subquery in
        # INSERT ... VALUES (the write runs under the session's lock, so no turn comes between).
        self.entity_session = compiled(
            sa.select(
                entities.c.session_id, entities.c.last_seen, newest_turn.label("newest_turn")
            ).where(of_entity)
        )
        self.add_context = compiled(
            contexts.insert().values(
                session_id=session_param(),
                entity_id=param("entity_id"),
                turn_id=None,
                turn_seq=param("turn_seq", sa.BigInteger),
                text=param("text", sa.Text),
                created_at=param("created_at", sa.Double),
            )
        )
        self.set_last_seen = compiled(
            entities.update().where(of_entity).values(last_seen=param("last_seen", sa.Double))
        )
