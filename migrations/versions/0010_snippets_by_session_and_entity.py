"""The snippets by session and entity, newest last: ``ix_contexts_session_id_entity_id_turn_seq_id``
replaces ``ix_contexts_session_id``.

Every read of an entity's newest snippets names the session (Citus routes by it) and the
entity, and orders by ``(turn_seq, id)``: this index matches that read exactly, so the
planner reads each entity's newest ones backwards and stops at the limit whatever the
statistics say. With only ``(session_id)`` and ``(entity_id, turn_seq, id)``, a table
that was never analysed (a bulk fill, an import, a restore) looked cheapest read as a
bitmap of the session's index AND-ed with the entity's, every snippet of the entity then
sorted: a recall slower by the entity's history (83 ms against 0.7 ms for one with
thousands of snippets). The new index also serves what read the session's snippets by
``(session_id)`` alone, which it leads with.

``ix_contexts_entity_id_turn_seq_id`` stays: the previous release reads an entity's
snippets by ``entity_id`` alone, and so do the SQLite statements of this one.

On Postgres, when the revision runs in transactions of its own (``db upgrade``), the index
is built ``CONCURRENTLY`` (reads and writes go on); one left invalid by an interrupted run
is dropped and built again; the index it replaces is dropped ``CONCURRENTLY`` afterwards.
Run so on SQLite, where an index is built in one statement that holds the write lock while it
reads every snippet, ``contexts`` is rebuilt with the new index in short transactions
(``zerda_store.db.migration.sqlite_online``): the index grows batch by batch as the rows
are copied.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from alembic.operations import BatchOperations

from zerda_store.db.migration import sqlite_online

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

INDEX = "ix_contexts_session_id_entity_id_turn_seq_id"
COLUMNS = ["session_id", "entity_id", "turn_seq", "id"]
REPLACED = "ix_contexts_session_id"

CITUS = "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"

# Set by env.py: the revision runs in transactions of its own on Postgres.
ONLINE_DDL = "online_ddl"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" and op.get_context().config.attributes.get(ONLINE_DDL):
        valid = bind.exec_driver_sql(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%(name)s)",
            {"name": INDEX},
        ).scalar()
        with op.get_context().autocommit_block():
            if not valid:  # missing, or left invalid by an interrupted run
                bind.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
                bind.exec_driver_sql(
                    f"CREATE INDEX CONCURRENTLY {INDEX} ON contexts ({', '.join(COLUMNS)})"
                )
            bind.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {REPLACED}")
        return
    if bind.dialect.name == "sqlite" and op.get_context().config.attributes.get(ONLINE_DDL):
        _rebuild_sqlite_online()
        return
    op.create_index(INDEX, "contexts", COLUMNS)
    op.drop_index(REPLACED, table_name="contexts")


def _replace_index(batch: BatchOperations) -> None:
    batch.create_index(INDEX, COLUMNS)
    batch.drop_index(REPLACED)


def _rebuild_sqlite_online() -> None:
    bind = op.get_bind()
    if INDEX in {index["name"] for index in sa.inspect(bind).get_indexes("contexts")}:
        return  # rebuilt by an interrupted run
    with sqlite_online.apart(bind) as pacing:
        sqlite_online.rebuild_table(bind, "contexts", _replace_index, pacing)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" and bind.exec_driver_sql(CITUS).scalar():
        # Citus: the shards' indexes made and dropped over one connection per node, so that
        # the views an earlier revision's downgrade then re-creates, in the same
        # transaction, are allowed (Citus refuses a view command after a parallel
        # operation on a distributed table).
        op.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
    op.create_index(REPLACED, "contexts", ["session_id"])
    op.drop_index(INDEX, table_name="contexts")
