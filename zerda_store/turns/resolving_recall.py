"""A recall that resolves its names in the statement that reads the snippets.

One statement returns two kinds of rows: the candidates a mention may join (the entities
and aliases whose key or core is among the mentions' keys and cores, as
``IdentityStatements.candidates`` finds them), and the newest snippets of every candidate
entity. The mentions are resolved among the candidates (``identity.resolve``), and the
snippets of the entities they name are kept: one round trip, whatever the names.

A candidate row has no ``context_id``; its ``text`` is the name it was found by and its
``core_key`` that name's core. Built from :mod:`zerda_store.schema`, compiled once per store
and shape; no I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect

from ..db.execution.driver import CompiledStatement, compile_statement
from ..db.execution.statements import binds_arrays
from ..db.schema import contexts, entities, entity_aliases
from ..identity.resolution import Resolver
from ..identity.statements import candidates_select, probe, probed_candidates
from ..model.records import Mention
from .statements import NEWEST_FIRST, lateral_recall, recalled_entity


class CandidateRow(NamedTuple):
    """A candidate as ``resolution.Resolver`` reads one."""

    entity_key: str
    entity_name: str
    core_key: str
    name: str


def _probed_recall(found: Any, aged: bool) -> Any:
    """Postgres: each candidate entity by its id (one probe each), joined LATERAL to its
    newest ``:limit`` snippets (the index of the session's snippets by entity and recency,
    read backwards and cut at the limit)."""
    chosen = sa.select(found.c.entity_id).distinct().subquery("chosen")
    entity = probe(
        entities, entities.c.id, chosen.c.entity_id,
        entities.c.id, entities.c.session_id, *recalled_entity(aged),
    )  # fmt: skip
    age = (contexts.c.created_at,) if aged else ()
    newest = (
        sa.select(contexts.c.text, contexts.c.turn_seq, contexts.c.id.label("context_id"), *age)
        .where(
            contexts.c.session_id == entity.c.session_id,
            contexts.c.entity_id == entity.c.id,
            # The session as a constant too, for Citus (see statements.lateral_recall).
            contexts.c.session_id == sa.bindparam("session_id", type_=sa.String),
        )
        .order_by(*NEWEST_FIRST)
        .limit(sa.bindparam("limit"))
        .lateral("newest")
    )
    return (
        sa.select(
            entity.c.name,
            entity.c.name_key,
            *((entity.c.entity_type,) if aged else ()),
            newest.c.text,
            newest.c.turn_seq,
            newest.c.context_id,
            *((newest.c.created_at,) if aged else ()),
        )
        .select_from(chosen)
        .join(entity, sa.true())
        .join(newest, sa.true())
    )


def _candidate_entities() -> Any:
    """Postgres: the entities among the candidates, by conditions on the parameters alone
    (each an index, OR-ed as a bitmap): planned well even before the tables' statistics
    say how many rows a session has, unlike a join to the candidates."""
    keys = sa.bindparam("keys", type_=ARRAY(sa.String))
    session = sa.bindparam("session_id", type_=sa.String)
    aliased = sa.select(entity_aliases.c.entity_id).where(
        entity_aliases.c.session_id == session,
        sa.or_(
            entity_aliases.c.alias_key == sa.any_(keys), entity_aliases.c.core_key == sa.any_(keys)
        ),
    )
    return sa.or_(
        entities.c.name_key == sa.any_(keys),
        entities.c.core_key == sa.any_(keys),
        entities.c.id == sa.any_(sa.func.array(aliased.scalar_subquery())),
    )


def _recall_by_keys(aged: bool, keyed: Any) -> Any:
    """SQLite (no LATERAL): the session's entities that ``keyed`` selects,
    joined to the snippets whose ids are among each one's newest ``:limit`` (a correlated
    subquery on the contexts index led by entity_id, read backwards and cut at the
    limit), then fetched by primary key. ``aged`` adds each snippet's creation time."""
    newest = contexts.alias("newest")
    newest_ids = (
        sa.select(newest.c.id)
        .where(newest.c.entity_id == entities.c.id)
        .order_by(newest.c.turn_seq.desc(), newest.c.id.desc())
        .limit(sa.bindparam("limit"))
        .correlate(entities)
    )
    age = (contexts.c.created_at,) if aged else ()
    return (
        sa.select(
            *recalled_entity(aged),
            contexts.c.text,
            contexts.c.turn_seq,
            contexts.c.id.label("context_id"),
            *age,
        )
        .join_from(entities, contexts, contexts.c.id.in_(newest_ids))
        .where(
            entities.c.session_id == sa.bindparam("session_id"),
            keyed,
        )
    )


def _resolving_recall(dialect: Dialect, aged: bool, distributed: bool) -> Any:
    if binds_arrays(dialect) and not distributed:
        found = probed_candidates().cte("candidates")
        snippets = _probed_recall(found, aged)
    elif binds_arrays(dialect):
        # Citus plans no probe fenced by OFFSET: there, one statement its router planner
        # sends whole to the session's shard (docs/citus.md).
        found = candidates_select(dialect).cte("candidates")
        snippets = lateral_recall(aged, _candidate_entities())
    else:
        found = candidates_select(dialect).cte("candidates")
        keyed = entities.c.name_key.in_(sa.select(found.c.entity_key))
        snippets = _recall_by_keys(aged, keyed)
    snippets = snippets.add_columns(sa.null().cast(entities.c.core_key.type).label("core_key"))
    nothing = {
        "entity_type": entities.c.entity_type.type,
        "turn_seq": contexts.c.turn_seq.type,
        "context_id": contexts.c.id.type,
        "created_at": contexts.c.created_at.type,
    }
    given = {
        "name": found.c.entity_name,
        "name_key": found.c.entity_key,
        "text": found.c.name,
        "core_key": found.c.core_key,
    }
    names = list(snippets.selected_columns.keys())
    candidates = sa.select(
        *(
            (given[name] if name in given else sa.null().cast(nothing[name])).label(name)
            for name in names
        )
    )
    return sa.union_all(snippets, candidates.select_from(found))


class ResolvingRecall:
    """The resolving recall statements of one dialect (plain and aged): one per store."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._compiled: dict[tuple[bool, bool], CompiledStatement] = {}
        # Postgres: a recall's keys, as one array, resolved and read in one statement.
        # SQLite: the own keys first, with the session's mark; this statement only if needed.
        self.in_one_statement = binds_arrays(dialect)

    def statement(self, aged: bool, distributed: bool = False) -> CompiledStatement:
        """The statement for ``aged`` rows, in the shape for tables ``distributed`` by
        Citus or not."""
        compiled = self._compiled.get((aged, distributed))
        if compiled is None:
            built = _resolving_recall(self._dialect, aged, distributed)
            compiled = self._compiled[aged, distributed] = compile_statement(built, self._dialect)
        return compiled

    @staticmethod
    def values(session_id: str, mentions: Sequence[Mention], limit: int) -> dict[str, Any]:
        keys = sorted({m.key for m in mentions} | {m.core_key for m in mentions})
        return {"session_id": session_id, "limit": limit, "keys": keys}


def split_rows(rows: list[Any]) -> tuple[list[Any], list[CandidateRow]]:
    """The snippet rows, and the candidate rows as the resolver reads them."""
    snippets = [row for row in rows if row.context_id is not None]
    candidates = [
        CandidateRow(row.name_key, row.name, row.core_key, row.text)
        for row in rows
        if row.context_id is None
    ]
    return snippets, candidates


def resolved(
    resolver: Resolver, mentions: Sequence[Mention], rows: list[Any]
) -> tuple[list[Any], list[str]]:
    """What a resolving recall's ``rows`` hold for ``mentions``: the snippet rows of the
    entities they name once resolved (aliases, titled forms), and those entities' keys in
    the order of the mentions, once each."""
    rows, candidates = split_rows(rows)
    targets = resolver.targets_among(candidates, mentions)
    keys = (targets[m.key].key if m.key in targets else m.key for m in mentions)
    wanted = dict.fromkeys(keys)  # in order, once each
    return [row for row in rows if row.name_key in wanted], list(wanted)


def marked_rows(rows: list[Any]) -> tuple[list[Any], bool]:
    """The snippet rows of a marked recall (``statements._recall_each_key``), and the session's
    mark: whether resolution could change what a mention that is its own core names. The
    one mark row (``context_id`` NULL) comes last as SQLite runs a ``UNION ALL``; found
    anywhere else, it is looked for."""
    if rows and rows[-1].context_id is None:
        return rows[:-1], bool(rows[-1].resolution_possible)
    snippets = [row for row in rows if row.context_id is not None]
    return snippets, any(row.resolution_possible for row in rows if row.context_id is None)
