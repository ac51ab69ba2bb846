"""Where a store that routes its calls to Citus's workers sends a session's calls
(:mod:`zerda_store.db.placements`): the option, and what the placements keep and read again,
with a stand-in coordinator (the real cluster: tests/distribution/test_worker_routing.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
        self.during_read: Callable[[], None] = lambda: None

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
        self.during_read()
        return [
            SimpleNamespace(shard=s, group=g, host=h, port=p) for s, (g, h, p) in self.nodes.items()
        ]

    def describe(self, exc: BaseException) -> str:
        return str(exc)


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr("zerda_store.db.placements.time.monotonic", lambda: self.now)


class Worker:
    def __init__(self, url: sa.URL) -> None:
        self.host, self.port = url.host, url.port
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _placements(coordinator: Coordinator) -> tuple[Placements[Worker], list[Worker]]:
    opened: list[Worker] = []

    def open_worker(url: sa.URL) -> Worker:
        opened.append(Worker(url))
        return opened[-1]

    return Placements(coordinator, open_worker), opened


def test_a_sessions_shard_is_read_once_and_the_nodes_every_ten_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, coordinator = Clock(monkeypatch), Coordinator()
    placements, opened = _placements(coordinator)
    assert placements.known("acme") == (False, None)
    assert placements.node_of("acme") == ("w1", 5432)
    assert placements.node_of("acme") == ("w1", 5432)
    assert placements.node_of("globex") is None  # the coordinator holds it
    assert coordinator.reads == ["shard", "nodes", "shard"]  # a new session: its shard only
    assert placements.worker(("w1", 5432)) is placements.worker(("w1", 5432))
    assert [(u.host, u.port) for u in opened] == [("w1", 5432)]

    coordinator.nodes[11] = (2, "w2", 5432)  # moved
    clock.now += placements_module.REFRESH_SECONDS - 0.1
    assert placements.node_of("acme") == ("w1", 5432)  # until read again
    clock.now += 0.1
    coordinator.reads.clear()
    assert placements.known("acme") == (False, None)
    assert placements.node_of("acme") == ("w2", 5432)
    assert coordinator.reads == ["nodes"]  # the session's shard is kept

    coordinator.shards["acme"] = 13  # split: shard 11 is gone
    coordinator.nodes = {13: (1, "w1", 5432), 12: (0, "coordinator", 5432)}
    clock.now += placements_module.REFRESH_SECONDS
    coordinator.reads.clear()
    assert placements.node_of("acme") == ("w1", 5432)
    assert coordinator.reads == ["nodes", "shard"]


def _started(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Clock, Coordinator, Placements[Worker], list[Worker]]:
    """Placements that have read where session "acme" is (worker w1)."""
    clock, coordinator = Clock(monkeypatch), Coordinator()
    placements, opened = _placements(coordinator)
    assert placements.node_of("acme") == ("w1", 5432)
    return clock, coordinator, placements, opened


def test_a_worker_that_wrote_nothing_has_the_nodes_read_again_at_most_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, coordinator, placements, _opened = _started(monkeypatch)
    coordinator.nodes[11] = (2, "w2", 5432)  # moved
    for _ in range(50):  # many saves that wrote nothing
        placements.stale()
        assert placements.node_of("acme") == ("w1", 5432)
    clock.now += placements_module.REREAD_AFTER_SECONDS
    coordinator.reads.clear()
    placements.stale()
    assert placements.node_of("acme") == ("w2", 5432)
    assert coordinator.reads == ["nodes"]


def test_one_thread_reads_the_nodes_while_the_others_use_the_last_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, coordinator, placements, _opened = _started(monkeypatch)
    clock.now += placements_module.REFRESH_SECONDS
    seen: list[Any] = []

    def meanwhile() -> None:  # another caller, while this one reads the nodes
        coordinator.during_read = lambda: None
        seen.append(placements.known("acme"))
        seen.append(placements.node_of("acme"))
        seen.append(placements.node_of("globex"))  # a new session: its shard, not the nodes

    coordinator.during_read = meanwhile
    coordinator.reads.clear()
    assert placements.node_of("acme") == ("w1", 5432)
    assert seen == [(True, ("w1", 5432)), ("w1", 5432), None]
    assert coordinator.reads == ["nodes", "shard"]
    assert placements.known("acme") == (True, ("w1", 5432))


def test_marked_stale_while_read_the_nodes_are_read_again_a_second_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, coordinator, placements, _opened = _started(monkeypatch)
    clock.now += placements_module.REFRESH_SECONDS
    coordinator.during_read = placements.stale  # a worker wrote nothing meanwhile
    placements.node_of("acme")
    coordinator.during_read = lambda: None
    clock.now += placements_module.REREAD_AFTER_SECONDS
    assert placements.known("acme") == (False, None)


def test_a_session_whose_shard_is_not_among_those_read_reads_them_at_most_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, coordinator, placements, _opened = _started(monkeypatch)
    coordinator.shards["initech"] = 14  # a shard newer than the nodes read (a split)
    coordinator.reads.clear()
    clock.now += placements_module.REREAD_AFTER_SECONDS
    assert placements.node_of("initech") is None
    assert coordinator.reads == ["shard", "nodes"]  # not there either: through the coordinator
    coordinator.reads.clear()
    assert placements.node_of("initech") is None
    assert coordinator.reads == ["shard"]
    coordinator.nodes[14] = (2, "w2", 5432)
    clock.now += placements_module.REREAD_AFTER_SECONDS
    assert placements.node_of("initech") == ("w2", 5432)


def test_a_worker_out_of_reach_is_passed_over_for_a_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, coordinator, placements, _opened = _started(monkeypatch)
    placements.unreachable(("w1", 5432), OSError("refused"))
    assert placements.node_of("acme") is None  # passed over
    clock.now += placements_module.REREAD_AFTER_SECONDS
    coordinator.reads.clear()
    assert placements.node_of("acme") is None  # read again soon, still passed over
    assert coordinator.reads == ["nodes"]
    clock.now += placements_module.PASS_OVER_SECONDS - 2 * placements_module.REREAD_AFTER_SECONDS
    assert placements.node_of("acme") is None
    clock.now += 2 * placements_module.REREAD_AFTER_SECONDS
    assert placements.node_of("acme") == ("w1", 5432)  # tried again


def test_a_failed_read_goes_through_the_coordinator_and_is_tried_again_a_second_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, coordinator, placements, _opened = _started(monkeypatch)
    coordinator.nodes[11] = (2, "w2", 5432)  # moved
    coordinator.down = True
    clock.now += placements_module.REFRESH_SECONDS
    assert placements.node_of("acme") is None  # the coordinator's call says what is wrong
    coordinator.down = False
    coordinator.reads.clear()
    assert placements.node_of("acme") is None  # not tried again at once
    assert coordinator.reads == []
    clock.now += placements_module.REREAD_AFTER_SECONDS
    assert placements.node_of("acme") == ("w2", 5432)  # the failed read left no claim
    assert coordinator.reads == ["nodes"]


def test_closed_placements_open_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    _clock, _coordinator, placements, opened = _started(monkeypatch)
    worker = placements.worker(("w1", 5432))
    assert placements.close() == [worker]
    with pytest.raises(StoreError, match="closed"):
        placements.worker(("w2", 5432))
    assert opened[-1].host == "w2" and opened[-1].closed  # opened meanwhile, then closed
