"""Citus: a save and a recall as functions run on the worker that holds the session's
shard, each one call from the coordinator (Citus's function-call delegation).

Through a coordinator every statement on a distributed table costs a planning on the
coordinator, a hop to the worker and a planning there; a save of several statements pays
that for each, and the recall, a statement Citus's fast-path planner does not take (a CTE,
a ``UNION ALL``, a ``LATERAL`` join), pays the full router planner twice. Distributed with
``create_distributed_function(..., 'p_session_id', colocate_with => 'turns')``, a function
called as ``SELECT ... FROM f(session_id, ...)`` outside a transaction block is sent whole
to the worker that holds the session's shard, and its statements run there. A statement on
a distributed table still costs Citus a planning there; so each function reads and writes
the session's shards themselves when they are on its node (:func:`_local_shards`), the
save under the lock Citus's own writes take against a move of the session's shard group,
each statement prepared once per shard group on the connection it runs on
(:class:`Statement`; docs/citus.md, Cost).

- The save (:data:`SAVE_FUNCTION`) takes the session's lock shared on the worker, bounded
  by the store's ``lock_timeout``, and the shard group's (:data:`SHARD_LOCK_FUNCTION`);
  where the group is not on its node (moved since the call was sent), it writes nothing.
  Otherwise it writes, in one statement, what :mod:`single_trip`'s statement writes:
  the same guard (nothing is written when a name needs resolving), the turn once per
  idempotency key, the entities upserted in key order, a snippet each, the ledger row. Its
  rows' ids come from the coordinator's sequences, read first (:attr:`DelegatedCalls.ids`),
  as the routed statements' do: a worker's sequence has a range of its own, and its ids
  would not order a session's turns. When the session has a turn newer than the ids read
  (a save of the same session in between), it writes nothing either, so that a session's
  turns keep their ids in the order they were stored (an erasure reads the turns saved
  while it ran as those after the newest it planned). Either way the routed unit of work
  follows (:mod:`db.routes`).
- The recall (:data:`RECALL_FUNCTION`) returns the rows of the resolving recall
  (:mod:`resolving_recall`), with the columns of an aged one: each entity's newest
  snippets, then the candidates a name may join in the statement's order (entities
  keyed, then cored, as a name; aliases keyed, then cored, so), read in one statement,
  on the shards where they are on its node, else through the distributed tables (Citus
  routes it).
- The lock (:data:`LOCK_FUNCTION`): erasure, clear, import and the other writes that take
  the session's lock exclusively take it on the worker too, through this function,
  distributed with ``force_delegation`` so that Citus runs it there inside their
  transaction (:func:`db.execution.unit_of_work.locked`).

``db distribute`` creates them (``CREATE OR REPLACE``: a second run after an upgrade
brings them up to date) and distributes them; a store uses them once it finds them
distributed (:mod:`db.sharding`), and routes every statement without them. Their names
carry a version: a release whose functions take other arguments or return other rows
names new ones (one that only runs them faster, as prepared statements, keeps the names:
``db distribute`` after the upgrade replaces their bodies).
"""

from __future__ import annotations

import hashlib
import textwrap
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSON
from sqlalchemy.engine import Connection, Dialect

from ..db.execution.driver import CompiledStatement, compile_statement
from ..db.execution.unit_of_work import SESSION_LOCK_NAMESPACE
from ..db.sharding import LOCK_FUNCTION, RECALL_FUNCTION, SAVE_FUNCTION, SHARD_LOCK_FUNCTION
from ..errors import StoreError
from ..model.names import UNKNOWN_TYPE

DISTRIBUTION_ARGUMENT = "p_session_id"

# (parameter, its SQL type, the single-trip value it takes, that value's type), in the
# function's order.
_SAVE_PARAMETERS: tuple[tuple[str, str, str, Any], ...] = (
    ("p_session_id", "varchar", "session_id", sa.String()),
    ("p_input_text", "text", "turn_input_text", sa.Text()),
    ("p_output_text", "text", "turn_output_text", sa.Text()),
    ("p_entity_names", "json", "turn_entity_names", JSON()),
    ("p_turn_created_at", "double precision", "turn_created_at", sa.Double()),
    ("p_idempotency_key", "varchar", "turn_idempotency_key", sa.String()),
    ("p_extractor", "varchar", "ledger_extractor", sa.String()),
    ("p_status", "varchar", "ledger_status", sa.String()),
    ("p_error", "text", "ledger_error", sa.Text()),
    ("p_latency_ms", "double precision", "ledger_latency_ms", sa.Double()),
    ("p_entity_count", "integer", "ledger_entity_count", sa.Integer()),
    ("p_attempts", "integer", "ledger_attempts", sa.Integer()),
    ("p_updated_at", "double precision", "ledger_updated_at", sa.Double()),
    ("p_name_key", "text[]", "name_key", ARRAY(sa.Text)),
    ("p_core_key", "text[]", "core_key", ARRAY(sa.Text)),
    ("p_name", "varchar[]", "name", ARRAY(sa.String)),
    ("p_entity_type", "varchar[]", "entity_type", ARRAY(sa.String)),
    ("p_first_position", "integer[]", "first_position", ARRAY(sa.Integer)),
    ("p_text", "text", "text", sa.Text()),
    ("p_created_at", "double precision", "created_at", sa.Double()),
    ("p_turn_id", "bigint", "turn_id", sa.BigInteger()),
    ("p_entity_ids", "bigint[]", "entity_ids", ARRAY(sa.BigInteger)),
    ("p_context_ids", "bigint[]", "context_ids", ARRAY(sa.BigInteger)),
    ("p_ledger_id", "bigint", "ledger_id", sa.BigInteger()),
    ("p_lock_timeout_ms", "integer", "lock_timeout_ms", sa.Integer()),
)


# The tables a function reads or writes through the distributed tables, each a constant
# named after it; the shards on its node are named where a statement is prepared.
_SAVE_TABLES = ("turns", "entities", "entity_aliases", "contexts", "extractions")
_RECALL_TABLES = ("entities", "entity_aliases", "contexts")


def _quoted(value: str) -> str:
    """``value`` as an SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _table_variables(schema: str, tables: tuple[str, ...]) -> str:
    """PL/pgSQL declarations: a constant per table, naming the distributed table; the
    session's shard and whether its group is here (:func:`_local_shards`); the statement
    to run and the name of its prepared form (:meth:`Statement.prepared`)."""
    names = "\n".join(
        f"  v_{table} CONSTANT text := {_quoted(schema + '.' + table)};" for table in tables
    )
    return (
        names + "\n  v_shard bigint;\n  v_local boolean := false;\n  v_plan text;\n  v_query text;"
    )


def _local_shards(schema: str, anchor: str, *, writes: bool) -> str:
    """PL/pgSQL: ``v_shard``, the session's shard of table ``anchor``, and ``v_local``,
    whether the session's shard group is placed on this node (and on no other).

    A statement on a distributed table costs Citus a planning on this node (docs/citus.md,
    Cost); one on the shard itself, a plain Postgres planning (once: :class:`Statement`).
    A call that ``writes`` first takes, shared, the lock on the session's shard group that
    Citus's own writes take, which a move or a split takes exclusively on every node while
    it switches the group to new placements (:func:`_shard_lock_definition`), and holds it
    to its end; it reads the placement after the lock (in a snapshot taken after it: read
    committed only), so that a call that waited for a move finds the group gone. A read
    takes no lock: as Citus's own reads, it reads the placement it finds. A group with a
    placement on another node too (replicated) is left to Citus, which writes every
    placement.
    """
    if writes:
        assert anchor == "turns"  # the shard whose lock the helper takes
        shard = f"{schema}.{SHARD_LOCK_FUNCTION}(p_session_id)"
        # The placement read after the lock: a statement's own snapshot, which only read
        # committed takes when the statement starts.
        fresh = "\n    AND current_setting('transaction_isolation') = 'read committed'"
    else:
        table = _quoted(f"{schema}.{anchor}")
        shard = f"get_shard_id_for_distribution_column({table}, p_session_id)"
        fresh = ""
    return f"""  v_shard := {shard};
  v_local := coalesce((SELECT bool_and(p.groupid = l.groupid)
                       FROM pg_dist_placement p, pg_dist_local_group l
                       WHERE p.shardid = v_shard), false){fresh};"""


def _shard_lock_definition(schema: str) -> str:
    """The session's shard group's lock, shared, as Citus's writes take it
    (``lock_shard_metadata``); returns the session's ``turns`` shard, or NULL for a caller
    that may not update ``turns`` (or where the function's owner does not own it).

    Citus lets only the tables' owner take that lock, and the application's role need not
    be (docs/operations.md, Roles): the function runs as its owner, the role that ran ``db
    distribute``, and takes the lock for a caller that may write the rows anyway (a write
    through Citus would take it for them).
    """
    turns = _quoted(f"{schema}.turns")
    return f"""CREATE OR REPLACE FUNCTION {schema}.{SHARD_LOCK_FUNCTION}(
  p_session_id varchar)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
  v_shard bigint;
BEGIN
  IF NOT has_table_privilege(session_user, {turns}, 'UPDATE')
     OR NOT pg_has_role((SELECT c.relowner FROM pg_class c WHERE c.oid = {turns}::regclass),
                        'USAGE') THEN
    RETURN NULL;
  END IF;
  v_shard := get_shard_id_for_distribution_column({turns}, p_session_id);
  PERFORM lock_shard_metadata(5, ARRAY[v_shard]);  -- 5: ShareLock
  RETURN v_shard;
END
$function$"""


# Marks a statement prepared on the connection: a setting of the session named after it
# (``zerda_prepared.<name>``), read in about a microsecond, where looking it up in
# ``pg_prepared_statements`` copies every prepared statement's text (about 55 µs with 50 of
# them here). A setting and a prepared statement both end with the connection, and DISCARD
# ALL drops both; a setting made in a transaction that rolled back is undone while the
# statement stays, so the mark missing, the view is read before preparing.
PREPARED_MARK = "zerda_prepared."


class Statement:
    """One of the functions' statements: its text (``%s`` each table's name, in
    ``tables``' order; ``$n`` the ``n``-th argument, a PL/pgSQL expression and its SQL
    type). :meth:`prepared` makes the PL/pgSQL that sets ``v_query`` to what runs it,
    ``USING`` :attr:`values`."""

    __slots__ = ("arguments", "name", "tables", "text")

    def __init__(
        self, text: str, tables: tuple[str, ...], arguments: tuple[tuple[str, str], ...]
    ) -> None:
        self.text = text
        self.tables = tables
        self.arguments = arguments
        types = ", ".join(sql_type for _, sql_type in arguments)
        # Named after what it prepares, so that a release whose statement differs (or its
        # arguments' types) never runs one an earlier release prepared on the connection.
        digest = hashlib.sha256(f"({types}) AS {text}".encode()).hexdigest()[:12]
        self.name = f"zerda_{digest}_"

    @property
    def values(self) -> str:
        """The arguments, in order, as the ``USING`` clause lists them."""
        return ", ".join(expression for expression, _ in self.arguments)

    def prepared(self, schema: str) -> str:
        """PL/pgSQL: ``v_query``, the statement to run ``USING`` :attr:`values`.

        On this node's shards (``v_local``), the execution of the statement prepared on the
        connection for the session's shard group (named by its shard, ``v_shard``), once:
        PostgreSQL plans it once per connection (a Citus connection to a worker lives on
        between calls) instead of at every call, as a statement naming a shard is dynamic
        SQL; the shards are named only when it is prepared, and :data:`PREPARED_MARK`
        says it was. ``EXECUTE`` takes no parameters from PL/pgSQL, so the values go into
        it as literals, each read as its prepared type. Elsewhere, the statement on the
        distributed tables, run with the values as parameters."""
        types = ", ".join(sql_type for _, sql_type in self.arguments)
        shards = ",\n        ".join(
            f"shard_name({_quoted(schema + '.' + table)}, get_shard_id_for_distribution_column("
            f"{_quoted(schema + '.' + table)}, p_session_id), false)"
            for table in self.tables
        )
        literals = ", ".join("%L" for _ in self.arguments)
        return f"""  IF v_local THEN
    v_plan := {_quoted(self.name)} || v_shard;
    IF current_setting({_quoted(PREPARED_MARK)} || v_plan, true) IS DISTINCT FROM 'yes' THEN
      IF NOT EXISTS (SELECT 1 FROM pg_prepared_statements s WHERE s.name = v_plan) THEN
        EXECUTE format({_quoted(f"PREPARE %I ({types}) AS {self.text}")}, v_plan,
          {shards});
      END IF;
      PERFORM set_config({_quoted(PREPARED_MARK)} || v_plan, 'yes', false);
    END IF;
    v_query := format({_quoted(f"EXECUTE %I ({literals})")}, v_plan, {self.values});
  ELSE
{textwrap.indent(self.dynamic(), "  ")}
  END IF;"""

    def forgotten(self) -> str:
        """PL/pgSQL: the statement prepared for the session's shard group, and its mark,
        dropped from the connection: after it was found gone (``DEALLOCATE ALL``, which
        psycopg sends after a rollback once it has prepared statements of its own, where
        the function runs in a client's session) or naming a shard dropped since. The next
        run prepares it again."""
        return f"""  v_plan := {_quoted(self.name)} || v_shard;
  IF EXISTS (SELECT 1 FROM pg_prepared_statements s WHERE s.name = v_plan) THEN
    EXECUTE format('DEALLOCATE %I', v_plan);
  END IF;
  PERFORM set_config({_quoted(PREPARED_MARK)} || v_plan, '', false);"""

    def dynamic(self) -> str:
        """PL/pgSQL: ``v_query``, the statement on the distributed tables (the variables),
        which Citus plans and routes."""
        tables = ", ".join(f"v_{table}" for table in self.tables)
        return f"""  v_query := format({_quoted(self.text)}, {tables});"""


# The type an entity's first mention gives it when the extractor gave none.
_UNKNOWN = f"{_quoted(UNKNOWN_TYPE)}::text"


def _save_arguments(*names: str) -> tuple[tuple[str, str], ...]:
    """The save's parameters ``names`` (or :data:`_UNKNOWN`) as a statement's arguments,
    each with its type."""
    types = {name: sql_type for name, sql_type, _, _ in _SAVE_PARAMETERS}
    types[_UNKNOWN] = "text"
    return tuple((name, types[name]) for name in names)


# What the save's guard reads, in one statement: the session's newest turn (by the index
# on session and id, whatever the statistics say), its entities keyed or cored as a
# mention, and its aliases so.
_SAVE_READ = Statement(
    "SELECT 1 AS part, x.id, NULL::text AS key, NULL::text AS core, NULL::bigint AS entity"
    " FROM (SELECT t.id FROM %s t WHERE t.session_id = $1 ORDER BY t.id DESC LIMIT 1) x"
    " UNION ALL SELECT 2, x.id, x.name_key, x.core_key, NULL FROM %s x"
    " WHERE x.session_id = $1 AND (x.name_key = ANY ($2) OR x.core_key = ANY ($3))"
    " UNION ALL SELECT 3, NULL, x.alias_key, x.core_key, x.entity_id FROM %s x"
    " WHERE x.session_id = $1 AND (x.alias_key = ANY ($2) OR x.core_key = ANY ($3))",
    ("turns", "entities", "entity_aliases"),
    _save_arguments("p_session_id", "p_name_key", "p_core_key"),
)
# The save's writes, in one statement: the turn once per idempotency key; then, when it
# was written, the entities upserted in key order (the mentions' order), a snippet of each
# (its id by its mention's place) and the ledger row.
_SAVE_WRITE = Statement(
    "WITH t AS (INSERT INTO %s AS t (id, session_id, input_text, output_text,"
    " entity_names, created_at, idempotency_key) VALUES ($1, $2, $3, $4, $5, $6, $7)"
    " ON CONFLICT (session_id, idempotency_key) DO NOTHING RETURNING t.id),"
    " e AS (INSERT INTO %s AS e (id, session_id, name_key, core_key, name, entity_type,"
    " first_seen, last_seen, first_turn_id, first_position)"
    " SELECT u.id, $2, u.name_key, u.core_key, u.name, u.entity_type, $8, $8, t.id,"
    " u.first_position FROM t, unnest($9::bigint[], $10::text[], $11::text[],"
    " $12::varchar[], $13::varchar[], $14::integer[]) WITH ORDINALITY"
    " u(id, name_key, core_key, name, entity_type, first_position, n) ORDER BY u.n"
    " ON CONFLICT (session_id, name_key) DO UPDATE SET"
    " name = CASE WHEN excluded.first_turn_id < e.first_turn_id"
    " THEN excluded.name ELSE e.name END,"
    " first_seen = CASE WHEN excluded.first_turn_id < e.first_turn_id"
    " THEN excluded.first_seen ELSE e.first_seen END,"
    " first_turn_id = CASE WHEN excluded.first_turn_id < e.first_turn_id"
    " THEN excluded.first_turn_id ELSE e.first_turn_id END,"
    " first_position = CASE WHEN excluded.first_turn_id < e.first_turn_id"
    " THEN excluded.first_position ELSE e.first_position END,"
    " last_seen = CASE WHEN excluded.last_seen > e.last_seen"
    " THEN excluded.last_seen ELSE e.last_seen END,"
    " entity_type = CASE WHEN e.entity_type = $15"
    " THEN excluded.entity_type ELSE e.entity_type END"
    " RETURNING e.id, e.name_key),"
    " c AS (INSERT INTO %s (id, session_id, entity_id, turn_id, turn_seq, text, created_at)"
    " SELECT ($16::bigint[])[k.n], $2, e.id, t.id, t.id, $17, $8 FROM t, e"
    " JOIN unnest($10::text[]) WITH ORDINALITY k(name_key, n) ON k.name_key = e.name_key),"
    " x AS (INSERT INTO %s (id, session_id, turn_id, extractor, status, error, latency_ms,"
    " entity_count, attempts, updated_at)"
    " SELECT $18, $2, t.id, $19, $20, $21, $22, $23, $24, $25 FROM t)"
    " SELECT t.id FROM t",
    ("turns", "entities", "contexts", "extractions"),
    _save_arguments(
        "p_turn_id",
        "p_session_id",
        "p_input_text",
        "p_output_text",
        "p_entity_names",
        "p_turn_created_at",
        "p_idempotency_key",
        "p_created_at",
        "p_entity_ids",
        "p_name_key",
        "p_core_key",
        "p_name",
        "p_entity_type",
        "p_first_position",
        _UNKNOWN,
        "p_context_ids",
        "p_text",
        "p_ledger_id",
        "p_extractor",
        "p_status",
        "p_error",
        "p_latency_ms",
        "p_entity_count",
        "p_attempts",
        "p_updated_at",
    ),
)


def _save_definition(schema: str) -> str:
    """The save function; ``schema`` is the tables' (quoted), where it is created too."""
    parameters = ",\n  ".join(f"{name} {sql_type}" for name, sql_type, _, _ in _SAVE_PARAMETERS)
    table_variables = _table_variables(schema, _SAVE_TABLES)
    local_shards = _local_shards(schema, "turns", writes=True)
    return f"""CREATE OR REPLACE FUNCTION {schema}.{SAVE_FUNCTION}(
  {parameters})
RETURNS TABLE (turn_id bigint, resolution_needed boolean)
LANGUAGE plpgsql
-- Its doubles go into the prepared statements as text: every digit of them, whatever the
-- session's setting.
SET extra_float_digits = 3
AS $function$
#variable_conflict use_column
DECLARE
  r record;
  v_keys text[] := '{{}}';
  v_ids bigint[] := '{{}}';
  v_cores text[] := '{{}}';
  v_alias_keys text[] := '{{}}';
  v_alias_entities bigint[] := '{{}}';
  v_turn bigint;
  v_newest bigint;
  v_own bigint;
  i integer;
  j integer;
{table_variables}
BEGIN
  -- The session's lock, shared, here on the shard's worker (see the module), waited for
  -- as long as the store's lock_timeout allows (the shard group's lock too).
  PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
  PERFORM pg_advisory_xact_lock_shared({SESSION_LOCK_NAMESPACE}, hashtext(p_session_id));
{local_shards}
  IF NOT v_local THEN  -- the shards are elsewhere (moved): the unit of work saves the turn
    RETURN QUERY SELECT NULL::bigint, true;
    RETURN;
  END IF;
  -- Twice at most: a statement prepared on this connection may be gone, or name a shard
  -- dropped since (Statement.forgotten); then it is prepared again.
  FOR v_attempt IN 1 .. 2 LOOP
    BEGIN
      v_keys := '{{}}'; v_ids := '{{}}'; v_cores := '{{}}';
      v_alias_keys := '{{}}'; v_alias_entities := '{{}}'; v_newest := NULL;
      -- What the guard reads, in one statement (_SAVE_READ).
{textwrap.indent(_SAVE_READ.prepared(schema), "    ")}
      FOR r IN EXECUTE v_query USING {_SAVE_READ.values} LOOP
        IF r.part = 1 THEN
          v_newest := r.id;
        ELSIF r.part = 2 THEN
          v_keys := v_keys || r.key;
          v_ids := v_ids || r.id;
          v_cores := v_cores || r.core;
        ELSE
          v_alias_keys := v_alias_keys || r.key;
          v_alias_entities := v_alias_entities || r.entity;
          v_cores := v_cores || r.core;
        END IF;
      END LOOP;
      -- A turn of the session newer than the ids read: the unit of work saves this one.
      IF p_turn_id <= v_newest THEN
        RETURN QUERY SELECT NULL::bigint, true;
        RETURN;
      END IF;
      -- The guard (single_trip._resolution_needed): a mention whose key an alias of another
      -- entity has, or that names no entity while an entity or an alias has its core.
      FOR i IN 1 .. coalesce(array_length(p_name_key, 1), 0) LOOP
        v_own := NULL;
        FOR j IN 1 .. coalesce(array_length(v_keys, 1), 0) LOOP
          IF v_keys[j] = p_name_key[i] THEN v_own := v_ids[j]; END IF;
        END LOOP;
        FOR j IN 1 .. coalesce(array_length(v_alias_keys, 1), 0) LOOP
          IF v_alias_keys[j] = p_name_key[i] AND v_alias_entities[j] IS DISTINCT FROM v_own THEN
            RETURN QUERY SELECT NULL::bigint, true;
            RETURN;
          END IF;
        END LOOP;
        IF v_own IS NULL AND p_core_key[i] = ANY (v_cores) THEN
          RETURN QUERY SELECT NULL::bigint, true;
          RETURN;
        END IF;
      END LOOP;
      -- The writes, in one statement (_SAVE_WRITE).
{textwrap.indent(_SAVE_WRITE.prepared(schema), "    ")}
      EXECUTE v_query INTO v_turn USING {_SAVE_WRITE.values};
      -- No turn: the idempotency key was used in the session.
      RETURN QUERY SELECT v_turn, false;
      RETURN;
    EXCEPTION WHEN invalid_sql_statement_name OR invalid_cursor_definition
                   OR undefined_table THEN
      IF v_attempt = 2 THEN
        RAISE;
      END IF;
{textwrap.indent(_SAVE_READ.forgotten(), "    ")}
{textwrap.indent(_SAVE_WRITE.forgotten(), "    ")}
    END;
  END LOOP;
END
$function$"""


_RECALL_COLUMNS = (
    ("name", "varchar"),
    ("name_key", "text"),
    ("entity_type", "varchar"),
    ("text", "text"),
    ("turn_seq", "bigint"),
    ("context_id", "bigint"),
    ("created_at", "double precision"),
    ("core_key", "text"),
)


# The recall's one statement (one snapshot): the session's entities keyed or cored as a key
# or named by an alias keyed or cored so, each with its newest snippets (a row of each, or
# one without when it has none), by id, newest first (part 1); then those aliases (part 2).
# Its tables' locks are taken in the order a save takes them, entities before snippets (the
# order db contract alters them in; with the entities in a CTE, a prepared statement took
# the snippets' lock first, and deadlocked with it).
_RECALL = Statement(
    "SELECT 1 AS part, x.id, x.name_key, x.name, x.core_key, x.entity_type,"
    " NULL::varchar AS alias, c.text, c.turn_seq, c.id AS context_id, c.created_at"
    " FROM %s x LEFT JOIN LATERAL (SELECT c.text, c.turn_seq, c.id, c.created_at FROM %s c"
    " WHERE c.session_id = $1 AND c.entity_id = x.id"
    " ORDER BY c.turn_seq DESC, c.id DESC LIMIT $3) c ON true"
    " WHERE x.session_id = $1 AND (x.name_key = ANY ($2) OR x.core_key = ANY ($2)"
    " OR x.id = ANY (ARRAY(SELECT a.entity_id FROM %s a WHERE a.session_id = $1"
    " AND (a.alias_key = ANY ($2) OR a.core_key = ANY ($2)))))"
    " UNION ALL SELECT 2, a.entity_id, a.alias_key, NULL, a.core_key, NULL, a.alias,"
    " NULL, NULL, NULL, NULL FROM %s a"
    " WHERE a.session_id = $1 AND (a.alias_key = ANY ($2) OR a.core_key = ANY ($2))"
    " ORDER BY 1, 2, 9 DESC, 10 DESC, 3",
    ("entities", "contexts", "entity_aliases", "entity_aliases"),
    (("p_session_id", "varchar"), ("p_keys", "varchar[]"), ("p_limit", "integer")),
)


def _recall_run(schema: str) -> str:
    """PL/pgSQL: the recall's statement run: each snippet returned as it comes (the
    entities by id, each one's newest first), the candidates gathered in the function's
    arrays."""
    return f"""\
{_RECALL.prepared(schema)}
  v_ids := '{{}}'; v_keys := '{{}}'; v_names := '{{}}'; v_cores := '{{}}'; v_types := '{{}}';
  v_alias_entities := '{{}}'; v_aliases := '{{}}'; v_alias_keys := '{{}}';
  v_alias_cores := '{{}}';
  FOR r IN EXECUTE v_query USING {_RECALL.values} LOOP
    IF r.part = 2 THEN
      v_alias_entities := v_alias_entities || r.id;
      v_aliases := v_aliases || r.alias;
      v_alias_keys := v_alias_keys || r.name_key;
      v_alias_cores := v_alias_cores || r.core_key;
      CONTINUE;
    END IF;
    IF v_ids[array_length(v_ids, 1)] IS DISTINCT FROM r.id THEN  -- an entity's first row
      v_ids := v_ids || r.id;
      v_keys := v_keys || r.name_key;
      v_names := v_names || r.name;
      v_cores := v_cores || r.core_key;
      v_types := v_types || r.entity_type;
    END IF;
    IF r.context_id IS NOT NULL THEN
      name := r.name; name_key := r.name_key; entity_type := r.entity_type; text := r.text;
      turn_seq := r.turn_seq; context_id := r.context_id; created_at := r.created_at;
      core_key := NULL;
      RETURN NEXT;
    END IF;
  END LOOP;
"""


def _or_through_distributed_tables(run: str, statement: Statement) -> str:
    """PL/pgSQL: ``run`` (of ``statement``), run again through the distributed tables if a
    shard it names is gone (dropped after a move since the placement was read: Citus drops
    a moved group's old shards once no statement holds them) or its prepared statement is
    (:meth:`Statement.forgotten`, which the next call prepares again); the rows of a failed
    run are none, as it fails before the statement runs."""
    return f"""  BEGIN
{textwrap.indent(run.rstrip(), "  ")}
  EXCEPTION WHEN undefined_table OR invalid_sql_statement_name OR invalid_cursor_definition THEN
{textwrap.indent(statement.forgotten(), "  ")}
    v_local := false;
{textwrap.indent(run.rstrip(), "  ")}
  END;"""


def _recall_definition(schema: str) -> str:
    """The recall function: the resolving recall's rows (:mod:`resolving_recall`), read in
    one statement (:data:`_RECALL`), filtered by the session in every part (which Citus
    routes whole to the session's shards where they are not on this node): each entity's
    newest snippets, then the candidates a name may join (the statement's order, as the
    resolving recall's). Volatile, as it prepares its statement; one statement reads one
    snapshot."""
    columns = ", ".join(f"{name} {sql_type}" for name, sql_type in _RECALL_COLUMNS)
    table_variables = _table_variables(schema, _RECALL_TABLES)
    local_shards = _local_shards(schema, "entities", writes=False)
    recall = _or_through_distributed_tables(_recall_run(schema), _RECALL)
    return f"""CREATE OR REPLACE FUNCTION {schema}.{RECALL_FUNCTION}(
  p_session_id varchar, p_keys varchar[], p_limit integer)
RETURNS TABLE ({columns})
LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
  r record;
  i integer;
  j integer;
  k integer;
  v_matched text;
  v_ids bigint[] := '{{}}';
  v_keys text[] := '{{}}';
  v_names varchar[] := '{{}}';
  v_cores text[] := '{{}}';
  v_types varchar[] := '{{}}';
  v_alias_entities bigint[] := '{{}}';
  v_aliases varchar[] := '{{}}';
  v_alias_keys text[] := '{{}}';
  v_alias_cores text[] := '{{}}';
{table_variables}
BEGIN
{local_shards}
{recall}
  -- The candidates, in the order of the statement's parts: entities keyed as a name, then
  -- cored as one; aliases keyed as one, then cored (each with its entity's key and name).
  entity_type := NULL; turn_seq := NULL; context_id := NULL; created_at := NULL;
  FOR i IN 1 .. coalesce(array_length(v_ids, 1), 0) LOOP
    IF v_keys[i] = ANY (p_keys) THEN
      name := v_names[i]; name_key := v_keys[i]; text := v_names[i]; core_key := v_cores[i];
      RETURN NEXT;
    END IF;
  END LOOP;
  FOR i IN 1 .. coalesce(array_length(v_ids, 1), 0) LOOP
    IF v_cores[i] = ANY (p_keys) THEN
      name := v_names[i]; name_key := v_keys[i]; text := v_names[i]; core_key := v_cores[i];
      RETURN NEXT;
    END IF;
  END LOOP;
  FOR j IN 1 .. coalesce(array_length(v_aliases, 1), 0) * 2 LOOP
    -- The aliases keyed as a name (the first round), then those cored as one.
    k := (j - 1) % array_length(v_aliases, 1) + 1;
    v_matched := CASE WHEN j <= array_length(v_aliases, 1) THEN v_alias_keys[k]
                      ELSE v_alias_cores[k] END;
    IF v_matched = ANY (p_keys) THEN
      FOR i IN 1 .. coalesce(array_length(v_ids, 1), 0) LOOP
        IF v_ids[i] = v_alias_entities[k] THEN
          name := v_names[i]; name_key := v_keys[i]; text := v_aliases[k];
          core_key := v_alias_cores[k];
          RETURN NEXT;
        END IF;
      END LOOP;
    END IF;
  END LOOP;
END
$function$"""


def _lock_definition(schema: str) -> str:
    """The session's lock taken on the worker that holds its shard (see the module)."""
    return f"""CREATE OR REPLACE FUNCTION {schema}.{LOCK_FUNCTION}(
  p_session_id varchar, p_exclusive boolean, p_lock_timeout_ms integer)
RETURNS void
LANGUAGE plpgsql
AS $function$
BEGIN
  -- For the rest of the transaction on this worker, as the store's lock_timeout.
  PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
  IF p_exclusive THEN
    PERFORM pg_advisory_xact_lock({SESSION_LOCK_NAMESPACE}, hashtext(p_session_id));
  ELSE
    PERFORM pg_advisory_xact_lock_shared({SESSION_LOCK_NAMESPACE}, hashtext(p_session_id));
  END IF;
END
$function$"""


def definitions(connection: Connection) -> list[str]:
    """The statements that create the functions in the current schema and distribute them,
    each by its session argument, co-located with ``turns``."""
    schema = connection.execute(sa.text("SELECT quote_ident(current_schema())")).scalar_one()
    if "$function$" in schema:  # the bodies' quotes
        raise StoreError(f"the functions cannot be created in a schema named {schema}")
    statements = [
        _shard_lock_definition(schema),
        _save_definition(schema),
        _recall_definition(schema),
        _lock_definition(schema),
    ]
    save_signature = ", ".join(sql_type for _, sql_type, _, _ in _SAVE_PARAMETERS)
    for function, signature, forced in (
        (SHARD_LOCK_FUNCTION, "varchar", "false"),
        (SAVE_FUNCTION, save_signature, "false"),
        (RECALL_FUNCTION, "varchar, varchar[], integer", "false"),
        (LOCK_FUNCTION, "varchar, boolean, integer", "true"),
    ):
        statements.append(
            f"SELECT create_distributed_function({_quoted(f'{schema}.{function}({signature})')}, "
            f"'{DISTRIBUTION_ARGUMENT}', colocate_with => 'turns', "
            f"force_delegation => {forced})"
        )
    return statements


class DelegatedCalls:
    """The calls, compiled once per store (Postgres): ``save`` takes
    :meth:`single_trip.SingleTripSave.values` and returns what the single-trip statement
    returns; ``recall`` takes :meth:`resolving_recall.ResolvingRecall.values` and returns
    the rows of an aged resolving recall."""

    def __init__(self, dialect: Dialect) -> None:
        save = getattr(sa.func, SAVE_FUNCTION)(
            *(sa.bindparam(value, type_=kind) for _, _, value, kind in _SAVE_PARAMETERS)
        ).table_valued("turn_id", "resolution_needed")
        self.save: CompiledStatement = compile_statement(sa.select(*save.c), dialect)
        # Each call as sent to the node that holds the session's shards (``route_to_workers``,
        # :mod:`db.placements`), with a filter that is always true (checked once per call)
        # and that the planner keeps: Citus delegates only a call with no filter, so it
        # runs this one where it is sent, without looking the session's placement up
        # (which it does for a bare call, even to find it on its own node), and lets
        # PostgreSQL keep its plan (a delegable call with parameters is planned at every
        # run). About 0.15 ms less per call here. Where the shards are not there after
        # all, the function finds them elsewhere, as when a move overtakes a delegated call.
        here = sa.text("pg_backend_pid() IS NOT NULL")
        self.save_here: CompiledStatement = compile_statement(
            sa.select(*save.c).where(here), dialect
        )
        # The ids of the rows a save may write, from the coordinator's sequences (where the
        # routed statements take theirs): one for the turn and its ledger row, one per
        # mention for a new entity and for its snippet, each list in ascending order.
        count = sa.bindparam("count", type_=sa.Integer())

        def sequence(table: str) -> Any:
            name: Any = sa.literal_column(f"'{table}'")
            return sa.func.nextval(sa.func.pg_get_serial_sequence(name, sa.literal_column("'id'")))

        def several(table: str) -> Any:
            one = sa.literal_column("1", sa.Integer)
            numbered = sa.func.generate_series(one, count).table_valued("n").render_derived()
            return sa.func.array(
                sa.select(sequence(table))
                .select_from(numbered)
                .order_by(numbered.c.n)
                .scalar_subquery()
            )

        self.ids: CompiledStatement = compile_statement(
            sa.select(
                sequence("turns").label("turn_id"),
                several("entities").label("entity_ids"),
                several("contexts").label("context_ids"),
                sequence("extractions").label("ledger_id"),
            ),
            dialect,
        )
        recall = getattr(sa.func, RECALL_FUNCTION)(
            sa.bindparam("session_id", type_=sa.String()),
            sa.bindparam("keys", type_=ARRAY(sa.String)),
            sa.bindparam("limit", type_=sa.Integer()),
        ).table_valued(*(name for name, _ in _RECALL_COLUMNS))
        self.recall: CompiledStatement = compile_statement(sa.select(*recall.c), dialect)
        self.recall_here: CompiledStatement = compile_statement(
            sa.select(*recall.c).where(here), dialect
        )
