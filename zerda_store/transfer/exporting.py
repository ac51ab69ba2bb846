"""Exporting a session: every row of it as plain records, from one snapshot (the records
:mod:`format` writes to a file and :mod:`importing` reads back). An export is an ad-hoc
read and goes through SQLAlchemy (:meth:`Store.query`), streamed a page at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from ..db.engine import Store
from ..db.schema import (
    contexts,
    entities,
    entity_aliases,
    extractions,
    in_same_session,
    turns,
)
from ..turns.history import PAGE_SIZE


def export_session(store: Store, session_id: str) -> Iterator[dict[str, Any]]:
    """Every row of a session as plain records, from one snapshot: turns with their
    ledger rows, entities in first-seen order, then snippets in each entity's order.
    Ids are the source database's and serve only as references between records."""
    with_ledger = (
        sa.select(
            turns.c.id,
            turns.c.input_text,
            turns.c.output_text,
            turns.c.entity_names,
            turns.c.created_at,
            turns.c.idempotency_key,
            extractions.c.extractor,
            extractions.c.status,
            extractions.c.error,
            extractions.c.latency_ms,
            extractions.c.entity_count,
            extractions.c.attempts,
            extractions.c.updated_at,
        )
        .outerjoin(
            extractions,
            in_same_session(extractions.c.turn_id, turns.c.id),
        )
        .where(turns.c.session_id == session_id)
        .order_by(turns.c.id)
    )
    in_first_seen_order = (
        sa.select(*(c for c in entities.c if c.name != "session_id"))
        .where(entities.c.session_id == session_id)
        .order_by(entities.c.first_turn_id, entities.c.first_position, entities.c.id)
    )
    snippets = (
        sa.select(
            contexts.c.id,
            contexts.c.entity_id,
            contexts.c.turn_id,
            contexts.c.turn_seq,
            contexts.c.text,
        )
        .join(
            entities,
            in_same_session(entities.c.id, contexts.c.entity_id),
        )
        .where(contexts.c.session_id == session_id)
        .order_by(
            entities.c.first_turn_id,
            entities.c.first_position,
            entities.c.id,
            contexts.c.turn_seq,
            contexts.c.id,
        )
    )
    aliases = (
        sa.select(
            entity_aliases.c.entity_id,
            entity_aliases.c.alias,
            entity_aliases.c.source,
            entity_aliases.c.created_at,
        )
        .where(entity_aliases.c.session_id == session_id)
        .order_by(entity_aliases.c.id)
    )
    with store.query() as connection:
        streaming = connection.execution_options(yield_per=PAGE_SIZE)
        for kind, query in (
            ("turn", with_ledger),
            ("entity", in_first_seen_order),
            ("context", snippets),
            ("alias", aliases),
        ):
            for row in streaming.execute(query):
                yield {"kind": kind, **row._asdict()}
