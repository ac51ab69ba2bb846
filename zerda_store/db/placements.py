"""Citus: a session's save and recall calls sent straight to the node that holds its shards.

Through the coordinator a delegated call (``turns.delegated``) pays a hop: the coordinator
finds the session's worker and sends the call on, a second round trip inside the first.
A store opened with ``route_to_workers=True`` (or ``?route_to_workers=true`` in its URL)
sends each save's call and each recall's call to that node itself, where the function reads
and writes the session's shards as it does when the coordinator sends it. Everything else
still goes to the coordinator: the save's ids (from the coordinator's sequences, which order
a session's turns), every unit of work, erasure and the operators' commands.

Where a session's shards are (:class:`Placements`, one per store):

- its shard of ``turns`` (Citus's ``get_shard_id_for_distribution_column``), read from the
  coordinator at the session's first call and kept (the most recent
  :data:`SESSIONS_KEPT` sessions); a shard id changes only when a shard is split;
- each shard's node (every placement of ``turns``' shards, one statement), read again
  every :data:`REFRESH_SECONDS`, and at the next call after one that a node could not
  write (its shards moved away) or after a node could not be reached.

A stale answer costs a hop, never a wrong write or a missed read: the functions check, under
the lock a shard move takes, that the session's shards are on their node. Where they are
not, the save writes nothing and its routed unit of work follows through the coordinator,
and the recall reads through the distributed tables, which Citus routes from that node.

Each worker gets a pool of its own, opened at its first call with the store's settings: the
store's URL (user, password, database, options) with the worker's host and port as the
coordinator names it in ``pg_dist_node``, so the application must reach the workers by
those names. A worker that cannot be reached is passed over until the next refresh; its
sessions' calls go through the coordinator meanwhile (docs/citus.md, Routing to workers).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Generic, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection

from ..errors import StoreError

logger = logging.getLogger("zerda_store.engine")

# How long a read of the shards' nodes is used before it is read again (seconds).
REFRESH_SECONDS = 10.0
# How many sessions' shard ids are kept (the most recently used).
SESSIONS_KEPT = 100_000

_SHARD = sa.text(
    "SELECT get_shard_id_for_distribution_column('turns', CAST(:session_id AS varchar))"
)
# Each shard of turns with the primary node that holds it; group 0 is the coordinator.
_NODES = sa.text(
    """
    SELECT p.shardid AS shard, n.groupid AS "group", n.nodename AS host, n.nodeport AS port
    FROM pg_dist_shard s
    JOIN pg_dist_placement p ON p.shardid = s.shardid
    JOIN pg_dist_node n ON n.groupid = p.groupid
    WHERE s.logicalrelid = 'turns'::regclass AND n.noderole = 'primary' AND n.isactive
    """
)

Address = tuple[str, int]
N = TypeVar("N")


class Coordinator(Protocol):
    """What the placements need of the coordinator's store."""

    @property
    def url(self) -> URL: ...

    def connect(self) -> AbstractContextManager[Connection]: ...

    def describe(self, exc: BaseException) -> str: ...


def worker_url(url: URL, address: Address) -> URL:
    """The store's URL with a worker's host and port (and no host of libpq's own)."""
    host, port = address
    return url.difference_update_query(("host", "hostaddr", "port")).set(host=host, port=port)


class Placements(Generic[N]):
    """Which node holds each session's shards, and a store (a pool) for each worker
    (see the module). ``open_worker(url)`` opens the store of a worker at ``url``."""

    def __init__(self, coordinator: Coordinator, open_worker: Callable[[URL], N]) -> None:
        self._coordinator = coordinator
        self._open_worker = open_worker
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._nodes: dict[int, Address | None] = {}  # None: the coordinator's own group
        self._read_at = float("-inf")
        self._workers: dict[Address, N] = {}
        self._passed_over: dict[Address, float] = {}  # since when
        self._closed = False

    def known(self, session_id: str) -> tuple[bool, Address | None]:
        """Whether where ``session_id``'s shards are is known without a read, and if so
        the address of the worker to send its calls to (None: the coordinator)."""
        with self._lock:
            shard = self._sessions.get(session_id)
            if shard is None or time.monotonic() - self._read_at >= REFRESH_SECONDS:
                return False, None
            self._sessions.move_to_end(session_id)
            if shard not in self._nodes:
                return False, None
            return True, self._usable(self._nodes[shard])

    def node_of(self, session_id: str) -> Address | None:
        """The address of the worker to send ``session_id``'s calls to: the one that holds
        its shards, read if need be; None where the coordinator holds them, where the
        worker is passed over, or where the read failed (the coordinator's call then
        reports what is wrong)."""
        known, address = self.known(session_id)
        if known:
            return address
        with self._lock:
            shard = self._sessions.get(session_id)
        try:
            self._read(session_id, shard)
        except (StoreError, sa.exc.DBAPIError) as exc:
            logger.warning(
                "could not read where the sessions' shards are (their calls go through the "
                "coordinator): %s",
                self._coordinator.describe(exc),
            )
            return None
        return self.known(session_id)[1]

    def worker(self, address: Address) -> N:
        """The store of the worker at ``address``, opened at its first call."""
        with self._lock:
            if self._closed:
                raise StoreError("this store is closed")
            found = self._workers.get(address)
            if found is None:
                found = self._workers[address] = self._open_worker(
                    worker_url(self._coordinator.url, address)
                )
            return found

    def opened(self) -> list[Address]:
        """The workers whose stores are open (each got a call)."""
        with self._lock:
            return list(self._workers)

    def unreachable(self, address: Address, exc: BaseException) -> None:
        """Pass the worker at ``address`` over until the next read of the nodes."""
        logger.warning(
            "cannot reach the Citus worker %s:%s; its sessions' calls go through the "
            "coordinator for now: %s",
            *address,
            self._coordinator.describe(exc),
        )
        with self._lock:
            self._passed_over[address] = time.monotonic()

    def stale(self) -> None:
        """Read the nodes again at the next call (a node found it holds no longer what it
        was sent)."""
        with self._lock:
            self._read_at = float("-inf")

    def close(self) -> list[N]:
        """Forget every worker's store, and return them for their owner to close."""
        with self._lock:
            self._closed = True
            workers, self._workers = list(self._workers.values()), {}
        return workers

    def _usable(self, address: Address | None) -> Address | None:
        since = self._passed_over.get(address) if address is not None else None
        if since is not None and time.monotonic() - since < REFRESH_SECONDS:
            return None
        return address

    def _read(self, session_id: str, known_shard: int | None) -> None:
        """Read every shard's node, and ``session_id``'s shard unless it is known and
        still there (a split replaces a shard)."""
        with self._coordinator.connect() as connection:
            rows = connection.execute(_NODES).all()
            nodes = {row.shard: None if row.group == 0 else (row.host, row.port) for row in rows}
            shard = known_shard
            if shard is None or shard not in nodes:
                shard = connection.execute(_SHARD, {"session_id": session_id}).scalar_one()
        with self._lock:
            self._sessions[session_id] = shard
            self._sessions.move_to_end(session_id)
            while len(self._sessions) > SESSIONS_KEPT:
                self._sessions.popitem(last=False)
            self._nodes = nodes
            self._read_at = time.monotonic()
