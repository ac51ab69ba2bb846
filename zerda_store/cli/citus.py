"""``db citus``: grow and shrink a Citus cluster under traffic, thin over :mod:`db.citus.nodes`
(registered on the ``db`` group by :mod:`cli.main`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click

from .common import Context, json_option, print_text


class Address(click.ParamType[str, Any]):
    """A node's ``HOST:PORT`` (the port 5432 when left out): anything else is a usage
    error, before the database is opened."""

    name = "host:port"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from .. import migrate

        try:
            migrate.cluster.parse_address(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return str(value)


@click.group("citus")
def citus() -> None:
    """Add, rebalance, drain and remove the workers of a Citus cluster while the application
    runs (shards move by logical replication: every node needs wal_level = logical). Run
    against the coordinator; see docs/citus.md, Growing and shrinking."""


@citus.command("nodes")
@json_option
@click.pass_obj
def nodes(obj: Context, as_json: bool) -> None:
    """List the nodes with their shard placements and the copies moves left on them."""
    from ..migrate import cluster

    found = cluster.nodes(obj.open(reading=True))
    if as_json:
        click.echo(json.dumps([asdict(node) for node in found]))
        return
    for node in found:
        role = "coordinator" if node.coordinator else "worker"
        flags = "" if node.should_have_shards or node.coordinator else ", takes no new shards"
        left = f", {node.leftovers} copies left behind" if node.leftovers else ""
        print_text(f"{node.address} {role}: {node.placements} placements{flags}{left}")


@citus.command("add-worker")
@click.argument("address", metavar="HOST:PORT", type=Address())
@click.option(
    "--no-rebalance", is_flag=True, help="Only register the worker; move no shard to it yet."
)
@click.pass_obj
def add_worker(obj: Context, address: str, no_rebalance: bool) -> None:
    """Register a worker (citus_add_node) that has the database and the citus extension,
    then move shards to it (citus_rebalance_start, shard_transfer_mode 'auto'), printing the
    job's progress. Checks first that every node runs with wal_level = logical and no
    rebalance runs."""
    from ..migrate import cluster

    store = obj.changing_store()
    cluster.add_worker(store, address, print_text)
    if not no_rebalance:
        cluster.rebalance(store, print_text)


@citus.command("rebalance")
@click.pass_obj
def rebalance(obj: Context) -> None:
    """Even out the shards over the workers (citus_rebalance_start, shard_transfer_mode
    'auto': writes pause only for each move's last catch-up), printing the job's progress
    until it finishes, then drop the copies the moves left behind
    (citus_cleanup_orphaned_resources: they hold the moved sessions' rows)."""
    from ..migrate import cluster

    store = obj.changing_store()
    found = cluster.problems(store)
    if found:
        raise click.ClickException(f"cannot move shards: {found[0]}")
    cluster.rebalance(store, print_text)


@citus.command("drain")
@click.argument("address", metavar="HOST:PORT", type=Address())
@click.pass_obj
def drain(obj: Context, address: str) -> None:
    """Move every shard off a worker (shouldhaveshards = false, then a drain-only rebalance
    in 'auto' mode), drop the copies the moves left on it (citus_cleanup_orphaned_resources),
    then remove it (citus_remove_node). Refused for the coordinator and the last worker."""
    from ..migrate import cluster

    cluster.drain(obj.changing_store(), address, print_text)
