"""What a shard move's last catch-up compares, on one worker of a cluster of its own.

    python -m tests.elastic.commit_position [--commits 2000] [--node-setting 'NAME = VALUE' ...]

Citus 13.2.2 blocks writes to the moving shard group, reads the source's position with
``SELECT pg_current_wal_lsn()`` (``multi_logical_replication.c``: the WAL *write* position)
and switches to the new copy once the subscription has reached it. A commit is acknowledged
when its record is in WAL: flushed first when ``synchronous_commit`` is on, only inserted
into the WAL buffers when it is off (the WAL writer writes it within ``wal_writer_delay``).

Here one connection commits one-row inserts on a worker, and after each acknowledged commit
another connection reads ``pg_current_wal_lsn()``, as the move's does. A commit whose
insert's WAL (``pg_current_wal_insert_lsn()`` read in the transaction, before its commit
record) lies beyond that position is one a catch-up started at that moment would not wait
for. Exit status 0 when no commit was beyond it.
"""

from __future__ import annotations

import argparse
import sys

import sqlalchemy as sa

from tests.elastic.cluster import add_node_settings, cluster


def measure(url: str, commits: int) -> int:
    """How many of ``commits`` acknowledged commits were beyond the WAL write position a
    second connection read right after them."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as writer, engine.connect() as mover:
            writer.exec_driver_sql("CREATE TABLE commits (n int)")
            writer.commit()
            beyond = 0
            for n in range(commits):
                writer.exec_driver_sql(f"INSERT INTO commits VALUES ({n})")
                inserted = writer.exec_driver_sql("SELECT pg_current_wal_insert_lsn()").scalar()
                writer.commit()
                behind = mover.exec_driver_sql(
                    f"SELECT pg_current_wal_lsn() < '{inserted}'::pg_lsn"
                ).scalar()
                mover.rollback()
                beyond += bool(behind)
            return beyond
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--commits", type=int, default=2000, help="Commits to make.")
    add_node_settings(parser)
    args = parser.parse_args(argv)
    with cluster(args.node_setting) as running:
        worker = running.workers()[0]
        settings = ", ".join(args.node_setting) or "scripts/citus's settings"
        beyond = measure(running.url(worker), args.commits)
    print(
        f"{beyond} of {args.commits} acknowledged commits were beyond pg_current_wal_lsn() "
        f"read right after them ({settings})"
    )
    return 0 if beyond == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
