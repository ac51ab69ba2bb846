"""Whether a store's tables are distributed by Citus, read once per store.

A statement Citus cannot route whole (a data-modifying CTE, an INSERT ... SELECT) is planned
in parts on the coordinator, each part's result shipped between the nodes: on a distributed
database the one-statement save (:mod:`turns.single_trip`) costs several hops, more than
its statements sent one by one, each routed to the session's shard. The save path asks
here which to use. Read at the first save of a store's life: a database distributed while
a server runs takes the one-by-one form at the server's next start (both forms are
correct on either)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from .engine import Store

_CITUS = sa.text("SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")
_TURNS_DISTRIBUTED = sa.text(
    "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'turns'::regclass)"
)


class Sharding:
    """The store's answer, once read (made once per store through :meth:`Store.statements`)."""

    def __init__(self, dialect: Dialect) -> None:
        self.distributed: bool | None = None if dialect.name == "postgresql" else False


def distributed(store: Store) -> bool:
    """True when the store's ``turns`` table is distributed by Citus (read once per store)."""
    sharding = store.statements(Sharding)
    if sharding.distributed is None:
        with store.connect() as connection:
            found = bool(connection.execute(_CITUS).scalar()) and bool(
                connection.execute(_TURNS_DISTRIBUTED).scalar()
            )
        sharding.distributed = found
    return sharding.distributed
