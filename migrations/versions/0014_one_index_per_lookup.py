"""One index per lookup: the core-key indexes led by the core, and the first-seen listing
on a partial index that only a listing names.

Until Postgres has statistics on a table (a freshly filled database, before autovacuum or
an ``ANALYZE``), it takes a session for about one row of a small table: then an index led
by ``session_id`` serves a lookup of one session's key as cheaply as the key's own index,
by reading the session and filtering it, and the planner picks either. A recall on a
never-analysed store of 2,002 entities found its entities by name on
``ix_entities_session_id_core_key`` (all of the session's rows, filtered), and its aliases
by key on ``ix_entity_aliases_session_id_core_key``. After this revision each lookup has
one index that can serve it:

- ``ix_entities_core_key_session_id`` and ``ix_entity_aliases_core_key_session_id``
  replace the ``(session_id, core_key)`` indexes: led by the core, they serve a lookup by
  core and nothing that names the session alone.
- ``ix_entities_first_seen`` replaces ``ix_entities_session_id_first_turn_id_first_position``
  with the same columns, partial on ``first_position >= 0`` (true of every entity): a read
  in first-seen order states the condition and is served by it; a lookup by key does not,
  and cannot take it.

The unique keys, ``(session_id, name_key)`` and ``(session_id, alias_key)``, stay each
table's one index led by the session: the lookups by those keys and the reads of a whole
session (counts, deletes) use them. A lookup by core or by id names the session inside a
row range led by its key (``zerda_store.identity.statements.probe``), which only its own
index can serve.

An expand step: the previous release runs on the new indexes (its listings sort the
session's entities instead of reading them in order, until it is replaced).

On Postgres, when the revision runs in transactions of its own (``db upgrade``), the
indexes are built ``CONCURRENTLY`` (reads and writes go on); one left invalid by an
interrupted run is dropped and built again; the indexes they replace are dropped
``CONCURRENTLY`` afterwards.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

FIRST_SEEN = "first_position >= 0"

# (table, new index, its columns, its condition, the index it replaces, that one's columns)
INDEXES = (
    (
        "entities",
        "ix_entities_core_key_session_id",
        ["core_key", "session_id"],
        None,
        "ix_entities_session_id_core_key",
        ["session_id", "core_key"],
    ),
    (
        "entity_aliases",
        "ix_entity_aliases_core_key_session_id",
        ["core_key", "session_id"],
        None,
        "ix_entity_aliases_session_id_core_key",
        ["session_id", "core_key"],
    ),
    (
        "entities",
        "ix_entities_first_seen",
        ["session_id", "first_turn_id", "first_position"],
        FIRST_SEEN,
        "ix_entities_session_id_first_turn_id_first_position",
        ["session_id", "first_turn_id", "first_position"],
    ),
)

CITUS = "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"

# Set by env.py: the revision runs in transactions of its own on Postgres.
ONLINE_DDL = "online_ddl"


def _create(table: str, name: str, columns: list[str], where: str | None) -> None:
    condition = sa.text(where) if where else None
    op.create_index(name, table, columns, sqlite_where=condition, postgresql_where=condition)


def _build_concurrently(table: str, name: str, columns: list[str], where: str | None) -> None:
    bind = op.get_bind()
    valid = bind.exec_driver_sql(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%(name)s)",
        {"name": name},
    ).scalar()
    if valid:
        return
    # Missing, or left invalid by an interrupted run.
    bind.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    condition = f" WHERE {where}" if where else ""
    bind.exec_driver_sql(
        f"CREATE INDEX CONCURRENTLY {name} ON {table} ({', '.join(columns)}){condition}"
    )


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" and op.get_context().config.attributes.get(ONLINE_DDL):
        with op.get_context().autocommit_block():
            for table, name, columns, where, _, _ in INDEXES:
                _build_concurrently(table, name, columns, where)
            for _, _, _, _, replaced, _ in INDEXES:
                bind.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {replaced}")
        return
    for table, name, columns, where, replaced, _ in INDEXES:
        _create(table, name, columns, where)
        op.drop_index(replaced, table_name=table)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" and bind.exec_driver_sql(CITUS).scalar():
        # Citus: the shards' indexes made and dropped over one connection per node, so that
        # the views an earlier revision's downgrade then re-creates, in the same
        # transaction, are allowed (Citus refuses a view command after a parallel
        # operation on a distributed table).
        op.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
    for table, name, _, _, replaced, replaced_columns in INDEXES:
        op.create_index(replaced, table, replaced_columns)
        op.drop_index(name, table_name=table)
