"""Statements of entity identity: the candidates a mention may join, aliases, merges and
the sessions' key rules. Built from :mod:`zerda_store.db.schema`, compiled once per store
(or once per migration); no I/O here.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect

from ..db.execution.statements import (
    Statements,
    binds_arrays,
    dialect_insert,
    param,
    session_param,
)
from ..db.schema import (
    contexts,
    entities,
    entity_aliases,
    entity_merges,
    identity_judgements,
    in_same_session,
    listed_first_seen,
    session_key_rules,
)


def _in_list(column: Any, dialect: Dialect) -> Any:
    """``column`` among the keys of ``:keys``: one array on Postgres, a JSON array read by
    ``json_each`` on SQLite, so that one statement serves any number of keys."""
    if binds_arrays(dialect):
        return column == sa.any_(sa.bindparam("keys", type_=ARRAY(sa.String)))
    values = sa.func.json_each(sa.bindparam("keys", type_=sa.JSON)).table_valued("value")
    return column.in_(sa.select(values.c.value))


def candidates_select(dialect: Dialect) -> Any:
    """Entities whose key or core is among ``:keys``, and the aliases whose key or core is,
    each with its entity's key and name: the names a mention may join
    (``identity.resolve``). Four parts, one index each (an OR of two lists would read
    the whole session)."""

    def by_entity(column: Any) -> Any:
        return sa.select(
            entities.c.name_key.label("entity_key"),
            entities.c.name.label("entity_name"),
            entities.c.core_key,
            entities.c.name,
        ).where(entities.c.session_id == session_param(), _in_list(column, dialect))

    def by_alias(column: Any) -> Any:
        return (
            sa.select(
                entities.c.name_key,
                entities.c.name,
                entity_aliases.c.core_key,
                entity_aliases.c.alias,
            )
            .join_from(
                entity_aliases,
                entities,
                in_same_session(entities.c.id, entity_aliases.c.entity_id),
            )
            .where(entity_aliases.c.session_id == session_param(), _in_list(column, dialect))
        )

    return sa.union_all(
        by_entity(entities.c.name_key),
        by_entity(entities.c.core_key),
        by_alias(entity_aliases.c.alias_key),
        by_alias(entity_aliases.c.core_key),
    )


# OFFSET 0 keeps the planner from flattening a LATERAL probe into a join it may reorder: each
# probe stays one descent of the index that matches both its conditions.
_KEEP_APART = sa.literal_column("0", sa.Integer)


def _keys() -> Any:
    """``unnest(:keys) AS anon(key)``: one row per key, to probe with."""
    keys = sa.bindparam("keys", type_=ARRAY(sa.String))
    return sa.func.unnest(keys).table_valued("key").render_derived()


# (table, column) of each table's unique key with the session, ``(session_id, column)``:
# the one index of the table led by the session.
_SESSION_KEYS = {(entities.name, "name_key"), (entity_aliases.name, "alias_key")}


def _in_session(table: sa.Table, column: Any, key: Any) -> Any:
    """The session's rows of ``table`` whose ``column`` is ``key``, in a form that one index
    alone serves, whatever the statistics say. Without statistics, Postgres takes a session
    of a small table for about one row, and then any index led by ``session_id`` looks as
    cheap for ``session_id = :session_id`` alone (the session read, the key filtered) as
    the key's own index: so a column other than the session's key (a core, an id) names
    the session only inside a row range led by the column, ``(column, session_id) BETWEEN
    (key, :session_id) AND (key, :session_id)``, which only the index led by the column,
    then the session, can serve (revision 0014). ``column = key`` too, for the estimate
    (one row)."""
    if (table.name, column.name) in _SESSION_KEYS:
        return sa.and_(table.c.session_id == _session(), column == key)
    return in_session_by(table, column, key)


def _session() -> Any:
    return sa.bindparam("session_id", type_=sa.String)


def in_session_by(table: Any, column: Any, key: Any) -> Any:
    """The session's rows of ``table`` (a table or an alias of one) whose ``column`` is
    ``key``, the session named only inside a row range led by ``column`` (see
    :func:`_in_session`): for a column whose index is ``(column, session_id)``. Not for
    a statement Citus must route: it routes by a plain ``session_id =``."""
    bound = sa.tuple_(key, _session())
    return sa.and_(column == key, sa.tuple_(column, table.c.session_id).between(bound, bound))


def probe(table: sa.Table, column: Any, key: Any, *selected: Any) -> Any:
    """LATERAL: ``selected`` of the session's rows of ``table`` whose ``column`` is ``key``."""
    return sa.select(*selected).where(_in_session(table, column, key)).offset(_KEEP_APART).lateral()


def probed_candidates() -> Any:
    """Postgres: the candidates of :func:`candidates_select`, with their
    entity's id, found by probing an index per key (``unnest`` joined LATERAL to a probe
    that only the index of the key and the session can serve: :func:`_in_session`). An
    ``= ANY(:keys)`` gives the planner a cheaper-looking scan of the whole session on the
    index led by ``session_id`` while the tables have no statistics, and keeps its generic
    plan off the indexes; a probe per key has no such choice."""

    def by_entity(column: Any) -> Any:
        keys = _keys()
        found = probe(
            entities, column, keys.c.key,
            entities.c.id, entities.c.name_key, entities.c.name, entities.c.core_key,
        )  # fmt: skip
        return sa.select(
            found.c.id.label("entity_id"),
            found.c.name_key.label("entity_key"),
            found.c.name.label("entity_name"),
            found.c.core_key,
            found.c.name,
        ).join_from(keys, found, sa.true())

    def by_alias(column: Any) -> Any:
        keys = _keys()
        alias = probe(
            entity_aliases, column, keys.c.key,
            entity_aliases.c.entity_id, entity_aliases.c.core_key, entity_aliases.c.alias,
        )  # fmt: skip
        entity = probe(
            entities, entities.c.id, alias.c.entity_id,
            entities.c.id, entities.c.name_key, entities.c.name,
        )  # fmt: skip
        return (
            sa.select(
                entity.c.id.label("entity_id"),
                entity.c.name_key.label("entity_key"),
                entity.c.name.label("entity_name"),
                alias.c.core_key,
                alias.c.alias.label("name"),
            )
            .join_from(keys, alias, sa.true())
            .join(entity, sa.true())
        )

    return sa.union_all(
        by_entity(entities.c.name_key),
        by_entity(entities.c.core_key),
        by_alias(entity_aliases.c.alias_key),
        by_alias(entity_aliases.c.core_key),
    )


def resolution_possible(session: Any) -> Any:
    """Whether name resolution can join a mention of the session that is its own core (no
    title, no legal form) to another entity than its key's: only when the session has an
    alias or a titled form (an entity whose key is not its core). Without either, the
    candidates of such a mention are its key's entity alone (``identity.resolve``).

    One probe of an index each (``uq_entity_aliases_session_id_alias_key``, the partial
    ``ix_entities_titled``), so this per-session mark is kept exact by every write in its
    own transaction, whatever process makes it. ``session``: the session id's parameter."""
    titled = entities.alias("titled")
    return sa.or_(
        sa.exists().where(entity_aliases.c.session_id == session),
        sa.exists().where(titled.c.session_id == session, titled.c.name_key != titled.c.core_key),
    )


ALIAS_COLUMNS = (
    "session_id", "entity_id", "alias_key", "core_key", "alias", "source", "created_at",
)  # fmt: skip
JUDGEMENT_COLUMNS = tuple(column.name for column in identity_judgements.c)
SAME, DIFFERENT = "same", "different"
ENTITY_COLUMNS = tuple(column.name for column in entities.c)
CONTEXT_COLUMNS = tuple(column.name for column in contexts.c)


def _values(table: sa.Table, columns: tuple[str, ...]) -> dict[str, Any]:
    return {name: sa.bindparam(name, type_=table.c[name].type) for name in columns}


class IdentityStatements(Statements):
    """The statements of aliases, merges and key rules for one dialect: one per store."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        insert = dialect_insert(dialect.name)
        compiled = self.compiled

        # Every statement names its session, by-id ones too, so that Citus runs each on the
        # session's shard alone (ids are unique per session on Postgres).
        in_session = entity_aliases.c.session_id == session_param()
        entity_in_session = entities.c.session_id == session_param()
        snippet_in_session = contexts.c.session_id == session_param()
        merge_in_session = entity_merges.c.session_id == session_param()
        self.candidates = compiled(candidates_select(dialect))
        # Postgres, on tables Citus does not distribute (it plans no probe fenced by
        # OFFSET): the same candidates, each found on its own index whatever the
        # statistics say (:func:`probed_candidates`).
        self.candidates_by_probe = (
            compiled(probed_candidates()) if binds_arrays(dialect) else self.candidates
        )
        self.add_alias = compiled(
            insert(entity_aliases)
            .values(_values(entity_aliases, ALIAS_COLUMNS))
            .on_conflict_do_nothing(
                index_elements=[entity_aliases.c.session_id, entity_aliases.c.alias_key]
            )
            .returning(entity_aliases.c.id)
        )
        self.alias_by_key = compiled(
            sa.select(
                entity_aliases.c.id, entity_aliases.c.entity_id, entity_aliases.c.alias
            ).where(in_session, entity_aliases.c.alias_key == param("alias_key", sa.Text))
        )
        self.remove_alias = compiled(
            sa.delete(entity_aliases).where(in_session, entity_aliases.c.id == param("alias_id"))
        )
        self.aliases_of = compiled(
            sa.select(
                entity_aliases.c.id,
                entity_aliases.c.alias,
                entity_aliases.c.alias_key,
                entity_aliases.c.source,
            )
            .where(in_session, entity_aliases.c.entity_id == param("entity_id"))
            .order_by(entity_aliases.c.id)
        )
        self.session_aliases = compiled(
            sa.select(
                entity_aliases.c.entity_id,
                entity_aliases.c.alias,
                entity_aliases.c.source,
                entity_aliases.c.created_at,
            )
            .where(in_session)
            .order_by(entity_aliases.c.id)
        )
        self.move_aliases = compiled(
            sa.update(entity_aliases)
            .where(in_session, entity_aliases.c.entity_id == param("from_id"))
            .values(entity_id=param("to_id"))
        )
        self.alias_to = compiled(
            sa.update(entity_aliases)
            .where(
                in_session,
                entity_aliases.c.id == param("alias_id"),
                entity_aliases.c.entity_id == param("from_id"),
            )
            .values(entity_id=param("to_id"))
        )
        # Merges.
        self.entity_by_key = compiled(
            sa.select(*entities.c).where(
                entity_in_session, entities.c.name_key == param("key", sa.Text)
            )
        )
        self.entity_by_id = compiled(
            sa.select(*entities.c).where(entity_in_session, entities.c.id == param("entity_id"))
        )
        self.insert_entity = compiled(sa.insert(entities).values(_values(entities, ENTITY_COLUMNS)))
        self.delete_entity = compiled(
            sa.delete(entities).where(entity_in_session, entities.c.id == param("entity_id"))
        )
        self.update_first_last = compiled(
            sa.update(entities)
            .where(entity_in_session, entities.c.id == param("entity_id"))
            .values(
                entity_type=param("entity_type", sa.String),
                first_seen=param("first_seen", sa.Double),
                last_seen=param("last_seen", sa.Double),
                first_turn_id=param("first_turn_id", sa.BigInteger),
                first_position=param("first_position"),
                name=param("name", sa.String),
            )
        )
        # Row locks in key order, the order saves upsert entities in: a save of the
        # previous release (no session lock) that holds one commits first, one that comes
        # later waits (``merging``, ``rekeying``). SQLite: one writer at a time, no clause.
        self.lock_session_entities = compiled(
            sa.select(entities.c.id)
            .where(entity_in_session)
            .order_by(entities.c.name_key)
            .with_for_update()
        )
        self.lock_pair = compiled(
            sa.select(*entities.c)
            .where(
                entity_in_session,
                sa.or_(entities.c.id == param("kept_id"), entities.c.id == param("merged_id")),
            )
            .order_by(entities.c.name_key)
            .with_for_update()
        )
        # Entities the previous release saved during a rolling deploy (no core yet).
        self.unkeyed_sessions = compiled(
            sa.select(entities.c.session_id).where(entities.c.core_key == "").distinct()
        )
        self.unkeyed_entities = compiled(
            sa.select(*entities.c)
            .where(entities.c.session_id == session_param(), entities.c.core_key == "")
            .order_by(entities.c.first_turn_id, entities.c.first_position, entities.c.id)
        )
        self.set_key = compiled(
            sa.update(entities)
            .where(entity_in_session, entities.c.id == param("entity_id"))
            .values(name_key=param("name_key", sa.Text), core_key=param("core_key", sa.Text))
        )
        self.contexts_of = compiled(
            sa.select(*contexts.c)
            .where(snippet_in_session, contexts.c.entity_id == param("entity_id"))
            .order_by(contexts.c.id)
        )
        self.delete_context = compiled(
            sa.delete(contexts).where(snippet_in_session, contexts.c.id == param("context_id"))
        )
        self.move_contexts = compiled(
            sa.update(contexts)
            .where(snippet_in_session, contexts.c.entity_id == param("from_id"))
            .values(entity_id=param("to_id"))
        )
        self.context_to = compiled(
            sa.update(contexts)
            .where(
                snippet_in_session,
                contexts.c.id == param("context_id"),
                contexts.c.entity_id == param("from_id"),
            )
            .values(entity_id=param("to_id"))
        )
        self.insert_context = compiled(
            sa.insert(contexts).values(_values(contexts, CONTEXT_COLUMNS))
        )
        merge_columns = (
            "session_id", "kept_entity_id", "merged_entity_id", "kept_name", "merged_name",
            "reason", "record", "created_at",
        )  # fmt: skip
        self.log_merge = compiled(
            sa.insert(entity_merges)
            .values(_values(entity_merges, merge_columns))
            .returning(entity_merges.c.id)
        )
        self.merge_by_id = compiled(
            sa.select(*entity_merges.c).where(
                merge_in_session, entity_merges.c.id == param("merge_id")
            )
        )
        # The names and cores ``similar_entities`` pairs, in first-seen order.
        self.names_and_cores = compiled(
            sa.select(entities.c.name, entities.c.core_key, entities.c.name_key)
            .where(entities.c.session_id == session_param(), listed_first_seen())
            .order_by(entities.c.first_turn_id, entities.c.first_position, entities.c.id)
        )
        self.merges = compiled(
            sa.select(*entity_merges.c).where(merge_in_session).order_by(entity_merges.c.id)
        )
        self.later_merge_of = compiled(
            sa.select(entity_merges.c.id)
            .where(
                merge_in_session,
                entity_merges.c.merged_entity_id == param("entity_id"),
                entity_merges.c.undone_at.is_(None),
            )
            .order_by(entity_merges.c.id.desc())
            .limit(1)
        )
        # The merges into an entity made after one of them and not undone, oldest first:
        # what an unmerge of the earlier one must carry its undoing through.
        self.later_merges_into = compiled(
            sa.select(*entity_merges.c)
            .where(
                merge_in_session,
                entity_merges.c.kept_entity_id == param("entity_id"),
                entity_merges.c.id > param("merge_id"),
                entity_merges.c.undone_at.is_(None),
            )
            .order_by(entity_merges.c.id)
        )
        self.update_merge_record = compiled(
            sa.update(entity_merges)
            .where(merge_in_session, entity_merges.c.id == param("merge_id"))
            .values(record=sa.bindparam("record", type_=entity_merges.c.record.type))
        )
        self.mark_undone = compiled(
            sa.update(entity_merges)
            .where(merge_in_session, entity_merges.c.id == param("merge_id"))
            .values(undone_at=param("undone_at", sa.Double))
        )
        self.turn_exists = compiled(
            sa.select(sa.literal(1, sa.Integer).label("one"))
            .select_from(sa.table("turns"))
            .where(sa.column("session_id") == session_param(), sa.column("id") == param("turn_id"))
        )
        # Judgements of suggested pairs.
        judged = identity_judgements.c
        judgement_in_session = judged.session_id == session_param()
        pair = (judged.key_a == param("key_a", sa.Text), judged.key_b == param("key_b", sa.Text))
        self.judge = compiled(
            insert(identity_judgements)
            .values(_values(identity_judgements, JUDGEMENT_COLUMNS))
            .on_conflict_do_update(
                index_elements=[judged.session_id, judged.key_a, judged.key_b],
                set_={
                    name: sa.bindparam(name, type_=identity_judgements.c[name].type)
                    for name in JUDGEMENT_COLUMNS
                    if name not in ("session_id", "key_a", "key_b")
                },
            )
        )
        self.judgement_of = compiled(
            sa.select(*identity_judgements.c).where(judgement_in_session, *pair)
        )
        self.unjudge = compiled(sa.delete(identity_judgements).where(judgement_in_session, *pair))
        self.judgements = compiled(
            sa.select(*identity_judgements.c)
            .where(judgement_in_session)
            .order_by(judged.decided_at, judged.key_a, judged.key_b)
        )
        self.clear_judgements = compiled(sa.delete(identity_judgements).where(judgement_in_session))
        # A forgotten entity's judgements name it (by its key, or by an alias's): they go too.
        names_of_entity = sa.union(
            sa.select(entities.c.name_key).where(
                entities.c.session_id == session_param(), entities.c.id == param("entity_id")
            ),
            sa.select(entity_aliases.c.alias_key).where(
                entity_aliases.c.session_id == session_param(),
                entity_aliases.c.entity_id == param("entity_id"),
            ),
        )
        self.forget_judgements = compiled(
            sa.delete(identity_judgements).where(
                judgement_in_session,
                sa.or_(judged.key_a.in_(names_of_entity), judged.key_b.in_(names_of_entity)),
            )
        )
        self.rejected_pairs = compiled(
            sa.select(judged.key_a, judged.key_b).where(
                judgement_in_session, judged.verdict == DIFFERENT
            )
        )
        # Key rules.
        self.record_rules = compiled(
            insert(session_key_rules)
            .values(_values(session_key_rules, ("session_id", "key_rules", "created_at")))
            .on_conflict_do_nothing(index_elements=[session_key_rules.c.session_id])
        )
        self.rules_of = compiled(
            sa.select(session_key_rules.c.key_rules).where(
                session_key_rules.c.session_id == session_param()
            )
        )
