"""`zerda-store db citus` on a real cluster (runs under ``scripts/test-citus`` only): the
nodes listed with their placements, and the refusals that change nothing. Adding, moving
and draining under load is `scripts/citus-elastic`'s (a cluster of its own)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.citus import Cluster
from tests.cli.helpers import invoke, json_of, one_line_error, succeeded

pytestmark = [pytest.mark.citus, pytest.mark.fans_out]  # the catalog of every node


@pytest.fixture
def url(citus_cluster: Cluster) -> Iterator[str]:
    found, drop = citus_cluster.new_database(distributed=True)
    yield found
    drop()


def test_nodes_lists_the_coordinator_and_the_workers_with_their_placements(
    url: str, citus_cluster: Cluster
) -> None:
    nodes = json_of(succeeded(invoke(url, "db", "citus", "nodes", "--json")))
    assert [(n["host"], n["port"]) for n in nodes] == [
        (citus_cluster.host, citus_cluster.port),
        *citus_cluster.workers_at,
    ]
    assert nodes[0]["placements"] == 0  # the coordinator holds no shard
    assert sum(n["placements"] for n in nodes) == 4 * 8  # 4 shards of 8 tables
    assert all(n["leftovers"] == 0 for n in nodes)
    lines = succeeded(invoke(url, "db", "citus", "nodes")).stdout.splitlines()
    assert lines[0] == f"{citus_cluster.host}:{citus_cluster.port} coordinator: 0 placements"


def test_draining_the_coordinator_or_the_last_workers_is_refused(
    url: str, citus_cluster: Cluster
) -> None:
    before = invoke(url, "db", "citus", "nodes", "--json").stdout
    coordinator = f"{citus_cluster.host}:{citus_cluster.port}"
    line = one_line_error(invoke(url, "db", "citus", "drain", coordinator))
    assert "is the coordinator" in line
    unknown = one_line_error(invoke(url, "db", "citus", "drain", "127.0.0.1:1"))
    assert "is not a node of the cluster" in unknown
    assert json.loads(invoke(url, "db", "citus", "nodes", "--json").stdout) == json.loads(before)


def test_adding_a_node_of_the_cluster_again_is_refused(url: str, citus_cluster: Cluster) -> None:
    host, port = citus_cluster.workers_at[0]
    line = one_line_error(invoke(url, "db", "citus", "add-worker", f"{host}:{port}"))
    assert "is a node of the cluster already" in line


def test_a_rebalance_with_nothing_to_move_says_so_and_cleans_up(url: str) -> None:
    output = succeeded(invoke(url, "db", "citus", "rebalance")).stdout
    assert output.splitlines() == ["no shard needs to move", "no copy left behind by the moves"]


def test_moving_shards_off_a_worker_that_commits_asynchronously_is_refused(
    url: str, citus_cluster: Cluster
) -> None:
    """A move's last catch-up waits only for the WAL its source has written: a commit made
    there with synchronous_commit = off just before the switch is lost (docs/citus.md)."""
    host, port = citus_cluster.workers_at[0]
    database = sa.make_url(url).database
    with citus_cluster.workers[0].connect() as connection:
        connection.exec_driver_sql(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    before = invoke(url, "db", "citus", "nodes", "--json").stdout
    for command in (("rebalance",), ("drain", f"{host}:{port}")):
        line = one_line_error(invoke(url, "db", "citus", *command))
        assert f"{host}:{port} runs with synchronous_commit = off" in line
    assert json.loads(invoke(url, "db", "citus", "nodes", "--json").stdout) == json.loads(before)
