"""Exporting a session: every row of it as plain records, from one snapshot (the records
:mod:`format` writes to a file and :mod:`importing` reads back). An export is an ad-hoc
read and goes through SQLAlchemy (:meth:`Store.query`), streamed a page at a time."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from ..db.execution.statements import whole_table_joins
from ..db.schema import (
    contexts,
    entities,
    entity_aliases,
    extractions,
    identity_judgements,
    in_same_session,
    listed_first_seen,
    turns,
)
from ..db.store import StoreCore
from ..retention.policies import Policies
from ..retention.policy import Visibility
from ..turns.history import PAGE_SIZE
from ..turns.reads import Reads


def export_session(
    store: StoreCore, session_id: str, *, include_expired: bool = False
) -> Iterator[dict[str, Any]]:
    """Every row of a session as plain records, from one snapshot: turns with their
    ledger rows, entities in first-seen order, then snippets in each entity's order.
    Ids are the source database's and serve only as references between records.

    Under a retention policy, what the memory's reads hide at this moment is left out
    (unless ``include_expired``): see :class:`_Shown`. What is shown is read just before
    the snapshot, in a read of its own, so a prune between the two may leave an entity
    with fewer snippets than were counted (docs/hardening.md)."""
    shown = None if include_expired else _Shown.of(store, session_id)
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
        .where(entities.c.session_id == session_id, listed_first_seen())
        .order_by(entities.c.first_turn_id, entities.c.first_position, entities.c.id)
    )
    snippets = (
        sa.select(
            contexts.c.id,
            contexts.c.entity_id,
            contexts.c.turn_id,
            contexts.c.turn_seq,
            contexts.c.text,
            *((contexts.c.created_at, entities.c.entity_type) if shown else ()),
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
    judged = identity_judgements.c
    judgements = (
        sa.select(
            judged.key_a,
            judged.key_b,
            judged.name_a,
            judged.name_b,
            judged.verdict,
            judged.decided_by,
            judged.decided_at,
        )
        .where(judged.session_id == session_id)
        .order_by(judged.decided_at, judged.key_a, judged.key_b)
    )
    with store.query() as connection:
        joins = whole_table_joins(store.engine.dialect)
        if joins is not None:
            # Whole sessions are read: joined by hash or merge, not row by row. Before the
            # tables have statistics (right after a large import) the planner takes a
            # session for a few rows, and a nested loop then joined each turn to every
            # ledger row of the session (quadratic: 70,000 turns took tens of minutes).
            connection.exec_driver_sql(joins)
        streaming = connection.execution_options(yield_per=PAGE_SIZE)
        for kind, query in (
            ("turn", with_ledger),
            ("entity", in_first_seen_order),
            ("context", snippets),
            ("alias", aliases),
            ("judgement", judgements),
        ):
            records = ({"kind": kind, **row._asdict()} for row in streaming.execute(query))
            yield from records if shown is None else shown.filtered(kind, records)


class _Shown:
    """What of a session the reads show at one moment: turns by the turn cutoff,
    entities with a snippet that shows (the reads' visible counts), snippets by their
    entity type's cutoff and each entity's last ``keep_last``, aliases of entities shown.
    A snippet shown whose turn is not is written without its turn."""

    def __init__(self, visible: Visibility, entity_ids: set[int]) -> None:
        self._visible = visible
        self._entity_ids = entity_ids
        self._turn_ids: set[int] = set()

    @classmethod
    def of(cls, store: StoreCore, session_id: str) -> _Shown | None:
        visible = Policies(store).visibility_now(session_id, time.time())
        if visible is None:
            return None
        return cls(visible, set(Reads(store).snippet_counts(session_id, visible)))

    def filtered(self, kind: str, records: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if kind == "turn":
            for record in records:
                if self._visible.shows_turn(record["created_at"]):
                    self._turn_ids.add(record["id"])
                    yield record
        elif kind == "context":
            yield from self._snippets(records)
        elif kind == "judgement":
            yield from records  # judgements of names, kept whatever the policy shows
        else:
            key = "id" if kind == "entity" else "entity_id"
            yield from (r for r in records if r[key] in self._entity_ids)

    def _snippets(self, records: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """One entity's snippets at a time (they come in each entity's order)."""
        for _, group in itertools.groupby(records, key=lambda r: r["entity_id"]):
            of_entity = [r for r in group if r["entity_id"] in self._entity_ids]
            if not of_entity:
                continue
            entity_type = of_entity[0].pop("entity_type")
            shown = [r for r in of_entity if self._visible.visible(entity_type, r["created_at"])]
            for record in self._visible.newest(shown, entity_type):
                record.pop("created_at")
                record.pop("entity_type", None)
                if record["turn_id"] not in self._turn_ids:
                    record["turn_id"] = None
                yield record
