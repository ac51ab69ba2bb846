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
  every :data:`REFRESH_SECONDS` by one thread while the others use the last read, and
  sooner (:data:`REREAD_AFTER_SECONDS` after the last read) once a worker wrote nothing
  (its shards may have moved away), a call failed on a worker, a worker could not be
  reached, or a session's shard is not among those read (a split since).

A stale answer after a move costs time, never a wrong write or a missed read: the functions
check, under the lock a shard move takes, that the session's shards are on their node.
Where they are not, the save writes nothing and its routed unit of work follows through the
coordinator, and the recall reads through the distributed tables, which Citus routes from
that node. (After a worker fails over, an old primary that still answers is another
matter: docs/citus.md.)

Each worker gets a pool of its own, opened at its first call with the store's settings: the
store's URL (user, password, database, options) with the worker's host and port as the
coordinator names it in ``pg_dist_node``, so the application must reach the workers by
those names. A worker that cannot be reached is passed over for :data:`PASS_OVER_SECONDS`;
its sessions' calls go through the coordinator meanwhile (docs/citus.md, Sending calls
straight to the workers).
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
# How soon after their last read the nodes are read again when a worker wrote nothing or
# could not be reached (seconds).
REREAD_AFTER_SECONDS = 1.0
# How long the calls of a worker that could not be reached go through the coordinator.
PASS_OVER_SECONDS = 60.0
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


class Closable(Protocol):
    def close(self) -> None: ...


N = TypeVar("N", bound=Closable)


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
        self._read_at = float("-inf")  # when the nodes' last read began
        self._expires = float("-inf")  # when they are to be read again
        self._refreshing = False  # a thread is reading them (the others use the last read)
        self._stale_meanwhile = False  # marked stale while that thread read them
        self._failed_at = float("-inf")  # when a read last failed
        self._workers: dict[Address, N] = {}
        self._passed_over: dict[Address, float] = {}  # since when
        self._closed = False

    def known(self, session_id: str) -> tuple[bool, Address | None]:
        """Whether where ``session_id``'s shards are is known without a read, and if so
        the address of the worker to send its calls to (None: the coordinator)."""
        with self._lock:
            shard = self._sessions.get(session_id)
            if shard is None or shard not in self._nodes:
                return False, None
            if time.monotonic() >= self._expires and not self._refreshing:
                return False, None
            self._sessions.move_to_end(session_id)
            return True, self._usable(self._nodes[shard])

    def node_of(self, session_id: str) -> Address | None:
        """The address of the worker to send ``session_id``'s calls to: the one that holds
        its shards, read if need be; None where the coordinator holds them, where the
        worker is passed over, where another thread is reading a shard this session's is
        newer than, or where the read failed (the coordinator's call then reports what is
        wrong; reads are tried again a second later)."""
        known, address = self.known(session_id)
        if known:
            return address
        began = time.monotonic()
        refresh = False  # whether this thread claimed the nodes' read (it alone clears it)
        try:
            with self._lock:
                if began - self._failed_at < REREAD_AFTER_SECONDS:
                    return None
                cached = self._sessions.get(session_id)
                nodes = self._nodes
                refresh = self._claim_refresh(began >= self._expires)
            with self._coordinator.connect() as connection:
                if cached is None or (cached not in nodes and not refresh):
                    shard, read_shard = self._shard(connection, session_id), True  # new, or split
                else:
                    shard, read_shard = cached, False
                if shard not in nodes and not refresh:  # a shard newer than the nodes read
                    with self._lock:
                        refresh = self._claim_refresh(began >= self._read_at + REREAD_AFTER_SECONDS)
                if refresh:
                    nodes = {
                        row.shard: None if row.group == 0 else (row.host, row.port)
                        for row in connection.execute(_NODES)
                    }
                    if shard not in nodes and not read_shard:  # split since it was read
                        shard = self._shard(connection, session_id)
            with self._lock:
                self._sessions[session_id] = shard
                self._sessions.move_to_end(session_id)
                while len(self._sessions) > SESSIONS_KEPT:
                    self._sessions.popitem(last=False)
                if refresh:
                    self._nodes = nodes
                    self._read_at = began
                    # Marked stale while it read: what it read may be older than that.
                    soon = REREAD_AFTER_SECONDS if self._stale_meanwhile else REFRESH_SECONDS
                    self._expires = began + soon
                    self._refreshing = self._stale_meanwhile = refresh = False
                return self._usable(nodes[shard]) if shard in nodes else None
        except (StoreError, sa.exc.DBAPIError) as exc:
            with self._lock:
                self._failed_at = time.monotonic()
            logger.warning(
                "could not read where the sessions' shards are (their calls go through the "
                "coordinator for a second): %s",
                self._coordinator.describe(exc),
            )
            return None
        finally:
            if refresh:  # claimed, and not read: let the next call read them
                with self._lock:
                    self._refreshing = False

    def worker(self, address: Address) -> N:
        """The store of the worker at ``address``, opened at its first call."""
        with self._lock:
            found = self._workers.get(address)
        if found is not None:
            return found
        opened = self._open_worker(worker_url(self._coordinator.url, address))
        with self._lock:
            closed = self._closed
            found = self._workers.setdefault(address, opened) if not closed else None
        if found is not opened:  # another thread's, or the store closed meanwhile
            opened.close()
        if found is None:
            raise StoreError("this store is closed")
        return found

    def opened(self) -> list[Address]:
        """The workers whose stores are open (each got a call)."""
        with self._lock:
            return list(self._workers)

    def unreachable(self, address: Address, exc: BaseException) -> None:
        """Pass the worker at ``address`` over for :data:`PASS_OVER_SECONDS`, and read the
        nodes again soon (it may have left the cluster)."""
        logger.warning(
            "cannot reach the Citus worker %s:%s; its sessions' calls go through the "
            "coordinator for %g s: %s",
            *address,
            PASS_OVER_SECONDS,
            self._coordinator.describe(exc),
        )
        with self._lock:
            self._passed_over[address] = time.monotonic()
        self.stale()

    def stale(self) -> None:
        """Read the nodes again soon: at the next call, or one second after their last
        read if that was more recent (a worker wrote nothing, which a name to resolve
        also causes: so that many such saves read them once)."""
        with self._lock:
            self._expires = min(self._expires, self._read_at + REREAD_AFTER_SECONDS)
            self._stale_meanwhile = self._refreshing

    def close(self) -> list[N]:
        """Forget every worker's store, and return them for their owner to close."""
        with self._lock:
            self._closed = True
            workers, self._workers = list(self._workers.values()), {}
        return workers

    def _claim_refresh(self, due: bool) -> bool:
        """Whether this thread reads the nodes now (they are ``due`` and no other thread
        is reading them); called under the lock."""
        if due and not self._refreshing:
            self._refreshing = True
            return True
        return False

    def _usable(self, address: Address | None) -> Address | None:
        since = self._passed_over.get(address) if address is not None else None
        if since is not None and time.monotonic() - since < PASS_OVER_SECONDS:
            return None
        return address

    @staticmethod
    def _shard(connection: Connection, session_id: str) -> int:
        return int(connection.execute(_SHARD, {"session_id": session_id}).scalar_one())
