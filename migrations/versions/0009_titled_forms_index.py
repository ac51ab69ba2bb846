"""The titled forms by session: a partial index of the entities whose key is not their core
("Dr. Sarah Chen", "Acme Inc."), ``ix_entities_titled``.

With the session's aliases (found by ``uq_entity_aliases_session_id_alias_key``), these
are what name resolution can join a mention to. A session that has neither skips
resolution on SQLite: one probe of each index, in the statement that needs to know
(``zerda_store.identity.statements.resolution_possible``). The index is that per-session
mark: every write that adds or removes a titled form or an alias (a save, a merge, an
unmerge, an import, a re-keying, an erasure) keeps it exact in the same transaction, on
any process, the previous release's writes included. Building it is the backfill: the
entities already stored are indexed by it.

On Postgres, when the revision runs in transactions of its own (``db upgrade``), the
index is built ``CONCURRENTLY`` (reads and writes go on); one left invalid by an
interrupted run is dropped and built again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

INDEX = "ix_entities_titled"
TITLED = "name_key <> core_key"

CITUS = "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"

# Set by env.py: the revision runs in transactions of its own on Postgres.
ONLINE_DDL = "online_ddl"


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite" and op.get_context().config.attributes.get(
        ONLINE_DDL
    ):
        valid = (
            op.get_bind()
            .exec_driver_sql(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%(name)s)",
                {"name": INDEX},
            )
            .scalar()
        )
        if not valid:  # missing, or left invalid by an interrupted run
            with op.get_context().autocommit_block():
                op.get_bind().exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
                op.get_bind().exec_driver_sql(
                    f"CREATE INDEX CONCURRENTLY {INDEX} ON entities (session_id) WHERE {TITLED}"
                )
        return
    where = sa.text(TITLED)
    op.create_index(INDEX, "entities", ["session_id"], sqlite_where=where, postgresql_where=where)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" and bind.exec_driver_sql(CITUS).scalar():
        # Citus: the shards' indexes dropped over one connection per node, so that the
        # views an earlier revision's downgrade then re-creates, in the same transaction,
        # are allowed (Citus refuses a view command after a parallel operation on a
        # distributed table).
        op.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
    op.drop_index(INDEX, table_name="entities")
