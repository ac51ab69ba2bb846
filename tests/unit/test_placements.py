"""Where a store that routes its calls to Citus's workers sends a session's calls
(:mod:`zerda_store.db.placements`): the option, and what the placements keep and read again,
with a stand-in coordinator (the real cluster: tests/distribution/test_worker_routing.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from zerda_store import Store
from zerda_store.db import placements as placements_module
from zerda_store.db.placements import Placements, worker_url
from zerda_store.db.store import core_of
from zerda_store.errors import StoreError


def test_the_option_is_read_from_the_url_and_refused_on_sqlite(tmp_path: Any) -> None:
    with Store("postgresql://app@127.0.0.1:1/crm?route_to_workers=true") as store:
        assert core_of(store).placements is not None
        assert "route_to_workers" not in str(store.engine.url)
    with Store("postgresql://app@127.0.0.1:1/crm", route_to_workers=True) as store:
        assert core_of(store).placements is not None
    with Store(
        "postgresql://app@127.0.0.1:1/crm?route_to_workers=true", route_to_workers=False
    ) as s:
        assert core_of(s).placements is None
    with Store("postgresql://app@127.0.0.1:1/crm") as store:
        assert core_of(store).placements is None
    with pytest.raises(StoreError, match="takes true or false"):
        Store("postgresql://app@127.0.0.1:1/crm?route_to_workers=maybe")
    with pytest.raises(StoreError, match="applies to Postgres only"):
        Store(f"sqlite:///{tmp_path / 'm.db'}", route_to_workers=True)


def test_a_workers_url_is_the_stores_with_the_workers_address() -> None:
    url = sa.make_url(
        "postgresql+psycopg://app:s3cret@coordinator:5432/crm?host=/tmp&sslmode=require"
    )
    found = worker_url(url, ("worker-2", 6432))
    assert (found.host, found.port, found.username, found.password) == (
        "worker-2",
        6432,
        "app",
        "s3cret",
    )
    assert found.database == "crm" and dict(found.query) == {"sslmode": "require"}


class Coordinator:
    """A stand-in coordinator: the shard of each session, and each shard's node."""

    url = sa.make_url("postgresql+psycopg://app@coordinator/crm")

    def __init__(self) -> None:
        self.shards = {"acme": 11, "globex": 12}
        self.nodes = {11: (1, "w1", 5432), 12: (0, "coordinator", 5432)}
        self.reads: list[str] = []
        self.down = False

    @contextmanager
    def connect(self) -> Iterator[Any]:
        if self.down:
            raise StoreError("cannot connect to the coordinator")
        yield self

    def execute(self, statement: Any, values: Any = None) -> Any:
        if statement is placements_module._SHARD:
            self.reads.append("shard")
            return SimpleNamespace(scalar_one=lambda: self.shards[values["session_id"]])
        self.reads.append("nodes")
        rows = [
            SimpleNamespace(shard=s, group=g, host=h, port=p) for s, (g, h, p) in self.nodes.items()
        ]
        return SimpleNamespace(all=lambda: rows)

    def describe(self, exc: BaseException) -> str:
        return str(exc)


def test_a_sessions_node_is_read_once_then_kept_until_the_nodes_are_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    coordinator = Coordinator()
    opened: list[sa.URL] = []

    def open_worker(url: sa.URL) -> sa.URL:
        opened.append(url)
        return url

    placements = Placements(coordinator, open_worker)
    assert placements.known("acme") == (False, None)
    assert placements.node_of("acme") == ("w1", 5432)
    assert placements.node_of("acme") == ("w1", 5432)
    assert placements.node_of("globex") is None  # the coordinator holds it
    assert coordinator.reads == ["nodes", "shard", "nodes", "shard"]
    assert placements.worker(("w1", 5432)) is placements.worker(("w1", 5432))
    assert [(u.host, u.port) for u in opened] == [("w1", 5432)]

    coordinator.nodes[11] = (2, "w2", 5432)  # moved
    assert placements.node_of("acme") == ("w1", 5432)  # until read again
    placements.stale()
    coordinator.reads.clear()
    assert placements.node_of("acme") == ("w2", 5432)
    assert coordinator.reads == ["nodes"]  # the session's shard is kept

    coordinator.shards["acme"] = 13  # split: shard 11 is gone
    coordinator.nodes = {13: (1, "w1", 5432)}
    placements.stale()
    coordinator.reads.clear()
    assert placements.node_of("acme") == ("w1", 5432)
    assert coordinator.reads == ["nodes", "shard"]

    now = [1000.0]
    monkeypatch.setattr("zerda_store.db.placements.time.monotonic", lambda: now[0])
    placements.stale()
    placements.node_of("acme")
    placements.unreachable(("w1", 5432), OSError("refused"))
    assert placements.known("acme") == (True, None)  # passed over
    now[0] += placements_module.REFRESH_SECONDS
    assert placements.node_of("acme") == ("w1", 5432)  # tried again after a refresh

    coordinator.down = True
    placements.stale()
    assert placements.node_of("acme") is None  # the coordinator's call says what is wrong
    assert placements.close() == opened
    with pytest.raises(StoreError, match="closed"):
        placements.worker(("w1", 5432))
