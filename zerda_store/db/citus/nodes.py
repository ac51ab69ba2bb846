"""Growing and shrinking a Citus cluster under traffic (``zerda-store db citus``): the
workers and their shards, adding a worker, rebalancing, and draining then removing one.

Citus does the work; this module calls its functions in the order that leaves nothing
behind and checks what they need first:

- every node runs with ``wal_level = logical``, so the rebalancer moves shards by logical
  replication (``shard_transfer_mode => 'auto'``): writes to a moving shard group pause
  only for its last catch-up, where ``block_writes`` stops them for the whole copy;
- no worker commits asynchronously (``synchronous_commit = off``): a move's last catch-up
  waits for the new copy to reach the source's WAL write position
  (``pg_current_wal_lsn()``), which an asynchronous commit may not have reached yet; the
  move then switches to the new copy without that commit's rows, and drops the old copy
  later with them;
- a rebalance (``citus_rebalance_start``) runs as Citus's background job, whose progress
  is read from ``citus_rebalance_status()`` until it finishes or fails; then the copies
  its moves left on the source workers are dropped (they hold the moved sessions' rows,
  which an erasure does not reach);
- a drain marks the node ``shouldhaveshards = false`` and moves its shards off as a
  background job (what ``citus_drain_node`` does, with progress), then drops the copies a
  move leaves behind (``CALL citus_cleanup_orphaned_resources()``) until no cleanup record
  names the node, and only then removes it (``citus_remove_node``). Removing a node whose
  cleanup records remain leaves a copy of its last shard group's rows on it, and the
  records make later moves fail (citusdata/citus#7333).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ...errors import RefusedValueError, StoreError
from ..sharding import citus_version, distributed_tables
from ..store import StoreCore, takes_store

# Terminal states of a background job (citus_rebalance_status()).
FINISHED = "finished"
STOPPED = ("failed", "cancelled")
# How long a drain waits for the moved shards' old copies to be dropped (a query still
# reading one holds it up) before it refuses to remove the node.
CLEANUP_SECONDS = 60.0

_NODES = sa.text(
    """
    SELECT n.nodename AS host, n.nodeport AS port, n.groupid AS group_id,
           n.isactive AS active, n.shouldhaveshards AS should_have_shards,
           (SELECT count(*) FROM pg_dist_placement p
              JOIN pg_dist_shard s ON s.shardid = p.shardid
              JOIN pg_dist_partition t ON t.logicalrelid = s.logicalrelid
             WHERE p.groupid = n.groupid AND t.partmethod = 'h') AS placements,
           (SELECT count(*) FROM pg_dist_cleanup c WHERE c.node_group_id = n.groupid)
               AS leftovers
    FROM pg_dist_node n
    WHERE n.noderole = 'primary'
    ORDER BY n.groupid
    """
)
# A setting as every worker has it (for the role and database of the connection).
_ON_WORKERS = sa.text(
    "SELECT nodename || ':' || nodeport AS node, result "
    "FROM run_command_on_workers(CAST(:command AS text))"
)
_STATUS = sa.text(
    "SELECT state, details FROM citus_rebalance_status() WHERE job_id = :job_id"
)  # fmt: skip
_RUNNING_JOB = sa.text(
    "SELECT job_id FROM pg_dist_background_job "
    "WHERE state NOT IN ('finished', 'failed', 'cancelled') ORDER BY job_id LIMIT 1"
)


@dataclass(frozen=True)
class Node:
    """A primary node of the cluster as Citus's catalog has it (group 0: the coordinator)."""

    host: str
    port: int
    group_id: int
    active: bool
    should_have_shards: bool
    # Placements of shards of distributed tables (not the reference tables' copies, which
    # every node holds and citus_remove_node drops).
    placements: int
    # Cleanup records (pg_dist_cleanup) naming the node: copies a move left behind.
    leftovers: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def coordinator(self) -> bool:
        return self.group_id == 0


@dataclass(frozen=True)
class Progress:
    """A background rebalance job as ``citus_rebalance_status()`` reports it."""

    job_id: int
    state: str
    done: int
    total: int
    # The last error a task of the job reported (Citus tries a failed task again).
    message: str | None = None

    @classmethod
    def reported(cls, job_id: int, state: str, details: dict[str, Any] | None) -> Progress:
        """The job's progress from the status's ``state`` and ``details``: its tasks
        counted by state, and the first line of the last message a task left."""
        counts: dict[str, int] = (details or {}).get("task_state_counts", {})
        messages = [t["message"] for t in (details or {}).get("tasks", []) if t.get("message")]
        message = messages[-1].splitlines()[0] if messages else None
        return cls(job_id, state, counts.get("done", 0), sum(counts.values()), message)

    def __str__(self) -> str:
        failing = f"; last error: {self.message}" if self.message else ""
        return f"rebalance job {self.job_id}: {self.state}, {self.done}/{self.total} moves{failing}"


Say = Callable[[str], None]


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (the port 5432 when left out) as a pair."""
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "5432")
    if not host or not port.isdigit():
        raise RefusedValueError(f"{address!r} is not HOST:PORT")
    return host, int(port)


@takes_store
def nodes(store: StoreCore) -> list[Node]:
    """The primary nodes, their shard placements and leftover copies."""
    with store.connect() as connection:
        _require_citus(store, connection)
        return [Node(**row._asdict()) for row in connection.execute(_NODES)]


@takes_store
def problems(store: StoreCore) -> list[str]:
    """What stops moving shards without blocking writes or losing any: the tables not
    distributed, a node whose ``wal_level`` is not ``logical``, a worker that commits
    asynchronously, a rebalance running already."""
    found = []
    with store.connect() as connection:
        _require_citus(store, connection)
        if not distributed_tables(connection):
            found.append(
                "zerda_store's tables are not distributed: run `zerda-store db distribute`"
            )
        levels = [("coordinator", connection.exec_driver_sql("SHOW wal_level").scalar())]
        levels += _on_workers(connection, "wal_level")
        found += [
            f"{node} runs with wal_level = {level}: set wal_level = logical in its "
            "postgresql.conf and restart it (shards move by logical replication)"
            for node, level in levels
            if level != "logical"
        ]
        found += [
            f"{node} runs with synchronous_commit = off: a shard move off it can lose "
            "writes committed there just before its switch (Citus waits only for the WAL "
            "already written, docs/citus.md); run ALTER SYSTEM SET synchronous_commit = on "
            "and SELECT pg_reload_conf() there (no restart), and reset it where a role or "
            "database sets it"
            for node, mode in _on_workers(connection, "synchronous_commit")
            if mode == "off"
        ]
        running = connection.execute(_RUNNING_JOB).scalar()
        if running is not None:
            found.append(
                f"a rebalance runs already (job {running}): wait for it, or stop it with "
                "SELECT citus_rebalance_stop()"
            )
    return found


@takes_store
def add_worker(store: StoreCore, address: str, say: Say) -> Node:
    """Register a worker (``citus_add_node``): it must have the database and the citus
    extension already (Citus copies the tables' definitions and roles to it)."""
    host, port = parse_address(address)
    if any((n.host, n.port) == (host, port) for n in nodes(store)):
        raise StoreError(f"{host}:{port} is a node of the cluster already")
    _refuse(problems(store))
    _check_new_node(store, host, port)
    with _autocommit(store) as connection:
        connection.execute(
            sa.text("SELECT citus_add_node(:host, :port)"), {"host": host, "port": port}
        )
    say(f"added {host}:{port} as a worker")
    return _node(store, host, port)


@takes_store
def rebalance(
    store: StoreCore, say: Say, *, drain_only: bool = False, poll: float = 1.0
) -> Progress | None:
    """Move shards (``citus_rebalance_start``, ``shard_transfer_mode => 'auto'``) and wait for
    the job, saying its progress, then drop the copies moves left behind (:func:`clean_up`);
    None when nothing needed to move. ``drain_only``: move
    only the shards of nodes marked ``shouldhaveshards = false``. A failed or cancelled job
    is a :class:`StoreError`."""
    with _autocommit(store) as connection:
        job_id = connection.execute(
            sa.text(
                "SELECT citus_rebalance_start(drain_only => :drain_only, "
                "shard_transfer_mode => 'auto')"
            ),
            {"drain_only": drain_only},
        ).scalar()
        progress = None if job_id is None else _wait(connection, int(job_id), say, poll)
    if progress is None:
        say("no shard needs to move")
    clean_up(store, say)
    return progress


@takes_store
def clean_up(store: StoreCore, say: Say) -> int:
    """Drop the copies moves left behind (``CALL citus_cleanup_orphaned_resources()``): they
    hold the moved sessions' rows, which an erasure does not reach. Returns how many
    remain (a copy a query still reads is dropped later, by Citus or the next call)."""
    with _autocommit(store) as connection:
        connection.exec_driver_sql("CALL citus_cleanup_orphaned_resources()")
        left = int(connection.exec_driver_sql("SELECT count(*) FROM pg_dist_cleanup").scalar() or 0)
    say(
        f"{left} copies left behind by moves remain (a query still reads them): run "
        "`zerda-store db citus rebalance` again later"
        if left
        else "no copy left behind by the moves"
    )
    return left


@takes_store
def drain(store: StoreCore, address: str, say: Say, *, poll: float = 1.0) -> Node:
    """Move every shard off a worker, drop the copies the moves left on it, then remove it
    from the cluster. Returns the node as it was just before its removal (no placement, no
    leftover)."""
    host, port = parse_address(address)
    node = _node(store, host, port)
    if node.coordinator:
        raise StoreError(f"{node.address} is the coordinator: it cannot be drained")
    others = [n for n in nodes(store) if n != node and n.should_have_shards and not n.coordinator]
    if not others:
        raise StoreError(f"{node.address} is the last worker that holds shards: add one first")
    _refuse(problems(store))
    with _autocommit(store) as connection:
        connection.execute(
            sa.text("SELECT citus_set_node_property(:host, :port, 'shouldhaveshards', false)"),
            {"host": host, "port": port},
        )
    say(f"{node.address} takes no new shards; moving its {node.placements} placements off")
    rebalance(store, say, drain_only=True, poll=poll)
    node = _clean_up(store, host, port, say)
    if node.placements:
        raise StoreError(f"{node.address} still holds {node.placements} placements: not removed")
    with _autocommit(store) as connection:
        connection.execute(
            sa.text("SELECT citus_remove_node(:host, :port)"), {"host": host, "port": port}
        )
    say(f"removed {node.address} from the cluster")
    return node


def _clean_up(store: StoreCore, host: str, port: int, say: Say) -> Node:
    """Drop what moves left behind until no cleanup record names the node."""
    deadline = time.monotonic() + CLEANUP_SECONDS
    while True:
        with _autocommit(store) as connection:
            connection.exec_driver_sql("CALL citus_cleanup_orphaned_resources()")
        node = _node(store, host, port)
        if not node.leftovers:
            say(f"no copy left behind on {node.address}")
            return node
        if time.monotonic() > deadline:
            raise StoreError(
                f"{node.address} still holds {node.leftovers} copies a move left behind (a query "
                "may still read one): not removed; run `CALL citus_cleanup_orphaned_resources()` "
                "and drain it again"
            )
        say(f"{node.leftovers} copies left behind on {node.address}: cleaning up again")
        time.sleep(1.0)


def _wait(connection: Connection, job_id: int, say: Say, poll: float) -> Progress:
    last = None
    while True:
        row = connection.execute(_STATUS, {"job_id": job_id}).one()
        progress = Progress.reported(job_id, row.state, row.details)
        if str(progress) != last:
            say(str(progress))
            last = str(progress)
        if progress.state == FINISHED:
            return progress
        if progress.state in STOPPED:
            raise StoreError(
                f"{progress}: see SELECT * FROM citus_rebalance_status() and docs/citus.md "
                "(a stuck rebalance)"
            )
        time.sleep(poll)


def _on_workers(connection: Connection, setting: str) -> list[tuple[str, str]]:
    """``SHOW setting`` on every worker: (``HOST:PORT``, its value) each."""
    found = connection.execute(_ON_WORKERS, {"command": f"SHOW {setting}"})
    return [(row.node, row.result) for row in found]


def _node(store: StoreCore, host: str, port: int) -> Node:
    for node in nodes(store):
        if (node.host, node.port) == (host, port):
            return node
    raise StoreError(f"{host}:{port} is not a node of the cluster (zerda-store db citus nodes)")


def _check_new_node(store: StoreCore, host: str, port: int) -> None:
    """The node answers with the store's database, role and password, has the citus
    extension, and runs with wal_level = logical."""
    engine = sa.create_engine(
        store.engine.url.set(host=host, port=port), poolclass=sa.pool.NullPool
    )
    try:
        with engine.connect() as connection:
            installed = citus_version(connection)
            level = connection.exec_driver_sql("SHOW wal_level").scalar()
    except sa.exc.DBAPIError as exc:
        raise StoreError(
            f"cannot reach the database on {host}:{port} ({store.describe(exc)}): create it and "
            "the citus extension there first"
        ) from None
    finally:
        engine.dispose()
    if not installed:
        raise StoreError(
            f"{host}:{port} has no citus extension in the database: CREATE EXTENSION citus there first"
        )
    if level != "logical":
        raise StoreError(
            f"{host}:{port} runs with wal_level = {level}: set it to logical and restart it"
        )


def _require_citus(store: StoreCore, connection: Connection) -> None:
    if store.dialect != "postgresql" or not citus_version(connection):
        raise StoreError(f"{store.safe_url} is not a Citus coordinator (no citus extension)")


def _refuse(found: list[str]) -> None:
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise StoreError(f"cannot move shards: {found[0]}{more}")


@contextmanager
def _autocommit(store: StoreCore) -> Iterator[Connection]:
    """A connection of the store whose statements commit at once (Citus's node functions
    run in their own transactions), without the store's lock_timeout: they wait for the
    locks they need as long as it takes."""
    with store.connect() as pooled:
        connection = pooled.execution_options(isolation_level="AUTOCOMMIT")
        connection.exec_driver_sql("SET lock_timeout = 0")
        try:
            yield connection
        finally:
            connection.exec_driver_sql("RESET lock_timeout")
