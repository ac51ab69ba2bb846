"""Planner statistics after a bulk write: the memory's tables analysed, on Postgres.

Right after a large write (a ``save_contexts`` of many turns, an import, a copy, an
upgrade that rewrote rows) the tables hold many more rows than Postgres's statistics say
until autovacuum gets to them (a minute or more later; never, where it is off). Plans
chosen meanwhile may read a session's rows where they should read an entity's
(docs/performance.md). The hot reads are shaped to be planned well either way, but what
else runs (operators' listings, exports, the views) is not: so a bulk writer analyses the
tables itself, once it has committed, as ``pg_restore``'s users are told to.

Not on SQLite, whose planner reads no statistics zerda_store would gather, and not on
Citus, where ``ANALYZE`` of a distributed table runs on every shard (autovacuum analyses
each shard on its worker).
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from .schema import metadata
from .sharding import distributed
from .store import StoreCore

logger = logging.getLogger("zerda_store.statistics")

# A write of this many turns or records, or more, analyses the tables afterwards: a
# ``save_context`` loop or small batches leave it to autovacuum (analysing costs a sample
# of each table, up to 30,000 rows each: tens of milliseconds to a few hundred).
BULK_ROWS = 1_000


def analyze_after(store: StoreCore, rows: int) -> None:
    """Analyse the memory's tables if a write of ``rows`` rows was a bulk one."""
    if rows >= BULK_ROWS:
        analyze(store)


def analyze(store: StoreCore) -> None:
    """``ANALYZE`` the memory's tables, in a transaction of its own, on Postgres only (not
    on Citus). A failure (a lock not granted in time, say) is logged and left at that: the
    write it follows is committed, and autovacuum analyses the tables later."""
    if store.dialect != "postgresql" or distributed(store):
        return
    tables = ", ".join(table.name for table in metadata.sorted_tables)
    try:
        with store.connect() as connection:
            connection.exec_driver_sql(f"ANALYZE {tables}")
            connection.commit()
    except DBAPIError as exc:
        logger.warning("the tables were not analysed after a bulk write: %s", store.describe(exc))


def analyze_if_never_analysed(store: StoreCore) -> bool:
    """``ANALYZE`` the memory's tables (as :func:`analyze`) when one of them has never been
    analysed and has had at least ``BULK_ROWS`` rows written since: a bulk job about to
    read whole sessions (a prune) is planned for tables of a few rows otherwise, and a
    ``keep_last`` prune of a million snippets took 238 s there, 26.5 s after ``ANALYZE``.
    Whether it analysed them. Postgres only (not Citus), as :func:`analyze`."""
    if store.dialect != "postgresql" or distributed(store):
        return False
    names = [table.name for table in metadata.sorted_tables]
    never = sa.text(
        "SELECT count(*) FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
        "WHERE c.oid = ANY(CAST(:tables AS regclass[])) AND s.last_analyze IS NULL "
        "AND s.last_autoanalyze IS NULL AND s.n_mod_since_analyze >= :rows"
    )
    try:
        with store.connect() as connection:
            found = connection.execute(never, {"tables": names, "rows": BULK_ROWS}).scalar_one()
            connection.rollback()
    except DBAPIError as exc:
        logger.warning("the tables' statistics were not looked up: %s", store.describe(exc))
        return False
    if not found:
        return False
    analyze(store)
    return True
