"""Whether a store's tables are distributed by Citus, read once per store.

A statement Citus cannot route whole (a data-modifying CTE, an INSERT ... SELECT) is planned
in parts on the coordinator, each part's result shipped between the nodes: on a distributed
database the one-statement save (:mod:`turns.single_trip`) costs several hops. There a save
and a recall are each one call of a function Citus runs on the worker that holds the
session's shard (``turns.delegated``), once ``db distribute`` has made the functions, and
otherwise their statements are sent one by one, each routed to the session's shard. The
save path asks here which to use. Read at the first save of a store's life: a database
distributed, or given its functions, while a server runs takes the new form at the
server's next start (every form is correct on either).

The catalog look-ups live here, not in :mod:`citus.distribution`, which ``db distribute``
uses: that module loads the migration machinery, which the save path must not."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

S = TypeVar("S")


class Catalogued(Protocol):
    """What the look-up needs of a store: its statements (where the answer is kept) and a
    connection."""

    def statements(self, factory: Callable[[Dialect], S]) -> S: ...

    def connect(self) -> AbstractContextManager[Connection]: ...


# The functions Citus runs on the worker that holds a session's shard (``turns.delegated``,
# created by ``db distribute``): the save, the recall, and the session's lock there. The
# version in the name changes whenever a release's functions do.
SAVE_FUNCTION = "zerda_save_turn_v1"
RECALL_FUNCTION = "zerda_recall_v1"
LOCK_FUNCTION = "zerda_session_lock_v1"
# What the save calls there first: the shard group's lock, as the tables' owner.
SHARD_LOCK_FUNCTION = "zerda_shard_lock_v1"
DELEGATED_FUNCTIONS = (SAVE_FUNCTION, RECALL_FUNCTION, LOCK_FUNCTION, SHARD_LOCK_FUNCTION)

_HAS_CATALOG = sa.text("SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")
# Citus's own catalog: how each table of the current schema is distributed (if at all).
_DISTRIBUTED = sa.text(
    """
    SELECT c.relname AS "table", p.partmethod AS method, p.repmodel AS replication,
           CASE WHEN p.partmethod = 'h'
                THEN column_to_column_name(p.logicalrelid, p.partkey) END AS column_name
    FROM pg_dist_partition p
    JOIN pg_class c ON c.oid = p.logicalrelid
    WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
    """
)
# Which of the functions are distributed, each by a session argument, in the current schema.
_DELEGATED = sa.text(
    """
    SELECT p.proname FROM pg_dist_object d JOIN pg_proc p ON p.oid = d.objid
    WHERE d.classid = 'pg_proc'::regclass AND d.distribution_argument_index IS NOT NULL
      AND p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
    """
)
_CITUS_VERSION = sa.text("SELECT extversion FROM pg_extension WHERE extname = 'citus'")


def citus_version(connection: Connection) -> str | None:
    """The version of the citus extension in the database, None if it is not installed."""
    return connection.execute(_CITUS_VERSION).scalar()


def distributed_tables(connection: Connection) -> dict[str, str]:
    """The tables of the current schema Citus distributes, each with how: ``"by
    session_id"`` (or another column), ``"reference"``, or ``"local"`` (added to Citus's
    metadata, not spread). Empty on a database without Citus's catalog."""
    if not connection.execute(_HAS_CATALOG).scalar():
        return {}
    found = {}
    for row in connection.execute(_DISTRIBUTED):
        if row.method == "h":
            found[row.table] = f"by {row.column_name}"
        else:
            found[row.table] = "reference" if row.replication == "t" else "local"
    return found


def delegated_functions(connection: Connection) -> bool:
    """Whether every function of :data:`DELEGATED_FUNCTIONS` is distributed in the current
    schema (``db distribute`` of this release has run)."""
    found = set(connection.execute(_DELEGATED).scalars())
    return found.issuperset(DELEGATED_FUNCTIONS)


class Sharding:
    """The store's answer, once read (made once per store through :meth:`Store.statements`):
    whether its tables are distributed, and whether the saves and recalls are delegated to
    the shards' workers (:data:`DELEGATED_FUNCTIONS` distributed)."""

    def __init__(self, dialect: Dialect) -> None:
        self.distributed: bool | None = None if dialect.name == "postgresql" else False
        self.delegated = False


def distributed(store: Catalogued) -> bool:
    """True when the store's ``turns`` table is distributed by Citus (read once per store,
    with whether the functions are there, :attr:`Sharding.delegated`)."""
    sharding = store.statements(Sharding)
    if sharding.distributed is None:
        with store.connect() as connection:
            spread = "turns" in distributed_tables(connection)
            sharding.delegated = spread and delegated_functions(connection)
        sharding.distributed = spread
    return sharding.distributed
