"""Postgres: a saved turn as one statement, so that a save is one round trip.

The statement inserts the turn, upserts its entities (in key order), and inserts one
snippet per entity and the turn's extraction-ledger row, each a data-modifying CTE fed by
the one before (the turn's new id, the entities' ids); every part names the session (a
lookup by core inside a row range led by the core, which only the core's index serves:
not a statement Citus routes, and it is not sent there: :mod:`delegated` writes the same
rows on the session's worker, :mod:`db.routes`). It is sent in one pipeline after
the statement that takes the session's lock (:mod:`execution.pipeline`), so that it reads with a
snapshot taken once the lock is held.

It writes only when name resolution has nothing to do (a guard in the statement): each
mention (titled or not: "Dr. Sarah Chen", "Acme Corp") names the entity keyed as it is,
or no entity yet and no other entity or alias has its core; and no alias keyed like it
names another entity. Otherwise it writes nothing, says so, and the save runs as the
general unit of work (:mod:`repository`), which resolves the names and records the joins.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect

from ..db.execution.driver import CompiledStatement, compile_statement
from ..db.schema import contexts, entities, entity_aliases, extractions, insert_columns, turns
from ..identity.statements import in_session_by, probe
from ..model.records import NewTurn
from .rows import new_outcome_row, new_turn_row
from .statements import entity_upsert

# The entity columns that come from the mentions, one array each (in key order).
MENTION_COLUMNS = ("name_key", "core_key", "name", "entity_type", "first_position")
_MENTION_TYPES = {
    "name_key": sa.String,
    "core_key": sa.String,
    "name": sa.String,
    "entity_type": sa.String,
    "first_position": sa.Integer,
}


def _bind(table: sa.Table, column: str, prefix: str = "") -> Any:
    return sa.bindparam(prefix + column, type_=table.c[column].type)


def _resolution_needed(session: Any, keys: Any, cores: Any) -> Any:
    """True when a mention keyed ``k`` with core ``c`` (``keys`` and ``cores``, in the same
    order) may join another entity than ``k``'s (``identity.resolve``): an alias keyed
    ``k`` names another entity; or no entity is keyed ``k`` and an entity or an alias has
    ``c`` as its core (a bare name, another titled form)."""
    mentioned = sa.func.unnest(keys, cores).table_valued("key", "core").render_derived("mentioned")
    # The mention's own entity, one probe of the unique key (a join would read the
    # session's entities whole while the tables have no statistics).
    own = probe(entities, entities.c.name_key, mentioned.c.key, entities.c.id)
    alias = entity_aliases.alias("alias")
    same_core = entities.alias("same_core")
    aliased_elsewhere = sa.exists().where(
        alias.c.session_id == session,
        alias.c.alias_key == mentioned.c.key,
        alias.c.entity_id.is_distinct_from(own.c.id),
    )
    # A core's lookups name the session only inside a row range led by the core, which
    # only the core's index serves, whatever the statistics say (revision 0014).
    core_of_alias = sa.exists().where(in_session_by(alias, alias.c.core_key, mentioned.c.core))
    core_of_entity = sa.exists().where(
        in_session_by(same_core, same_core.c.core_key, mentioned.c.core)
    )
    return sa.exists(
        sa.select(mentioned.c.key)
        .select_from(mentioned)
        .outerjoin(own, sa.true())
        .where(
            sa.or_(
                aliased_elsewhere,
                sa.and_(own.c.id.is_(None), sa.or_(core_of_alias, core_of_entity)),
            )
        )
    )


def _save_statement() -> Any:
    """The whole save; it returns one row: the new turn's id (None when nothing was
    written) and whether resolution is needed (then nothing was written)."""
    session = sa.bindparam("session_id", type_=sa.String)
    keys = sa.bindparam("name_key", type_=ARRAY(sa.String))
    cores = sa.bindparam("core_key", type_=ARRAY(sa.String))
    guard = sa.select(_resolution_needed(session, keys, cores).label("needed")).cte("guard")
    turn_columns = insert_columns(turns)
    turn_values = [
        session.label("session_id")
        if column == "session_id"
        else _bind(turns, column, "turn_").label(column)
        for column in turn_columns
    ]
    new_turn = (
        postgresql.insert(turns)
        .from_select(list(turn_columns), sa.select(*turn_values).where(sa.not_(guard.c.needed)))
        .on_conflict_do_nothing(index_elements=[turns.c.session_id, turns.c.idempotency_key])
        .returning(turns.c.id)
        .cte("new_turn")
    )
    arrays: list[Any] = [
        sa.bindparam(column, type_=ARRAY(_MENTION_TYPES[column])) for column in MENTION_COLUMNS
    ]
    mentioned = sa.func.unnest(*arrays).table_valued(*MENTION_COLUMNS).render_derived("mentioned")
    at = sa.bindparam("created_at", type_=turns.c.created_at.type)
    entity_values = {
        "session_id": session,
        **{column: mentioned.c[column] for column in MENTION_COLUMNS},
        "first_seen": at,
        "last_seen": at,
        "first_turn_id": new_turn.c.id,
    }
    entity_columns = insert_columns(entities)
    upserted = entity_upsert(
        postgresql.insert(entities).from_select(
            list(entity_columns),
            sa.select(*(entity_values[column].label(column) for column in entity_columns))
            .select_from(new_turn)
            .join(mentioned, sa.true())
            .order_by(mentioned.c.name_key),
        )
    ).cte("upserted")
    snippet_values = {
        "session_id": session,
        "entity_id": upserted.c.id,
        "turn_id": new_turn.c.id,
        "turn_seq": new_turn.c.id,
        "text": sa.bindparam("text", type_=contexts.c.text.type),
        "created_at": at,
    }
    snippet_columns = insert_columns(contexts)
    snippets = (
        sa.insert(contexts)
        .from_select(
            list(snippet_columns),
            sa.select(*(snippet_values[column].label(column) for column in snippet_columns))
            .select_from(new_turn)
            .join(upserted, sa.true()),
        )
        .cte("snippets")
    )
    ledger_columns = insert_columns(extractions)
    ledger_values = [
        session.label(column)
        if column == "session_id"
        else new_turn.c.id.label(column)
        if column == "turn_id"
        else _bind(extractions, column, "ledger_").label(column)
        for column in ledger_columns
    ]
    ledger = (
        sa.insert(extractions)
        .from_select(list(ledger_columns), sa.select(*ledger_values).select_from(new_turn))
        .cte("ledger")
    )
    return sa.select(
        sa.select(new_turn.c.id).scalar_subquery().label("turn_id"),
        guard.c.needed.label("resolution_needed"),
    ).add_cte(snippets, ledger)


class SingleTripSave:
    """The single-statement save, compiled once per store (Postgres only)."""

    def __init__(self, dialect: Dialect) -> None:
        self.statement: CompiledStatement = compile_statement(_save_statement(), dialect)

    @staticmethod
    def values(session_id: str, turn: NewTurn) -> dict[str, Any]:
        """The statement's values for one turn (its mentions in key order)."""
        values: dict[str, Any] = {"session_id": session_id, "created_at": turn.created_at}
        for column, value in new_turn_row(session_id, turn).items():
            if column != "session_id":
                values["turn_" + column] = value
        for column, value in new_outcome_row(session_id, 0, turn).items():
            if column not in ("session_id", "turn_id"):
                values["ledger_" + column] = value
        ordered = sorted(enumerate(turn.mentions), key=lambda item: item[1].key)
        values["name_key"] = [mention.key for _, mention in ordered]
        values["core_key"] = [mention.core_key for _, mention in ordered]
        values["name"] = [mention.name for _, mention in ordered]
        values["entity_type"] = [mention.entity_type for _, mention in ordered]
        values["first_position"] = [position for position, _ in ordered]
        values["text"] = turn.text
        return values
