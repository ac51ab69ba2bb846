"""A Citus cluster of the elastic harness's own (``scripts/citus``, with a state file of its
own), one more node started on asking, and a database made on the nodes the way
docs/citus.md tells an operator to. Every node may be given more ``postgresql.conf``
settings (``ZERDA_CITUS_NODE_SETTINGS``), and the nodes' logs may be kept when it stops."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "citus"
SHARDS = 8


class ClusterError(Exception):
    """The cluster could not be started or changed (not a finding of the harness)."""


class Cluster:
    """The running cluster: its coordinator's admin URL and the ``scripts/citus`` state."""

    def __init__(self, env: dict[str, str], admin_url: str) -> None:
        self.env = env
        self.admin_url = sa.make_url(admin_url)
        self.database = f"zerda_elastic_{uuid.uuid4().hex[:8]}"

    def _script(self, verb: str) -> str:
        done = subprocess.run(
            [str(SCRIPT), verb], env=self.env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise ClusterError(f"scripts/citus {verb}: {done.stderr.strip()}")
        return done.stdout.strip().splitlines()[-1]

    def add_node(self) -> str:
        """Start one more node and make the database and extension on it: its HOST:PORT."""
        address = self._script("add-node")
        host, port = address.rsplit(":", 1)
        self.make_database(self.admin_url.set(host=host, port=int(port)))
        return address

    def make_database(self, node: sa.URL) -> None:
        _run(node, f'CREATE DATABASE "{self.database}"')
        _run(node.set(database=self.database), "CREATE EXTENSION citus")

    def url(self, node: sa.URL | None = None) -> str:
        at = (node or self.admin_url).set(database=self.database)
        return at.render_as_string(hide_password=False)

    def workers(self) -> list[sa.URL]:
        rows = _rows(
            self.admin_url, "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid > 0"
        )
        return [self.admin_url.set(host=h, port=int(p)) for h, p in rows]

    def set_up(self) -> None:
        """The database on the coordinator and both workers, the workers registered, and a
        shard count for it (the tables are distributed later, by ``db distribute``)."""
        workers = self.workers()
        for node in (self.admin_url, *workers):
            self.make_database(node)
        at = self.admin_url.set(database=self.database)
        calls = [
            f"SELECT citus_set_coordinator_host('{self.admin_url.host}', {self.admin_url.port})"
        ]
        calls += [f"SELECT citus_add_node('{w.host}', {w.port})" for w in workers]
        _run(at, *calls)
        _run(self.admin_url, f'ALTER DATABASE "{self.database}" SET citus.shard_count = {SHARDS}')


@contextmanager
def cluster(settings: list[str], logs: Path | None = None) -> Iterator[Cluster]:
    """A coordinator and two workers, every node started with ``settings`` (postgresql.conf
    lines) too; stopped (with every node added) at the end, after their logs are copied to
    ``logs`` (when given)."""
    handle, state = tempfile.mkstemp(prefix="zerda-citus-elastic.")
    os.close(handle)
    os.unlink(state)
    env = {
        **os.environ,
        "ZERDA_CITUS_STATE": state,
        "ZERDA_CITUS_NODE_SETTINGS": "\n".join(settings),
    }
    try:
        started = subprocess.run(
            [str(SCRIPT), "start"], env=env, capture_output=True, text=True, check=False
        )
        if started.returncode != 0:
            raise ClusterError(f"scripts/citus start: {started.stderr.strip()}")
        running = Cluster(env, started.stdout.strip().splitlines()[-1])
        running.set_up()
        yield running
    finally:
        if logs is not None:
            _keep_logs(state, logs)
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, check=False)


def add_node_settings(parser: argparse.ArgumentParser) -> None:
    """The ``--node-setting`` option: more ``postgresql.conf`` lines for every node."""
    parser.add_argument(
        "--node-setting",
        action="append",
        default=[],
        metavar="'NAME = VALUE'",
        help="One more postgresql.conf line for every node (repeatable).",
    )


def _keep_logs(state: str, into: Path) -> None:
    """Copy the nodes' server logs (``PORT.log`` in the folder the state file records)."""
    recorded = Path(state)
    lines = recorded.read_text().splitlines() if recorded.exists() else []
    into.mkdir(parents=True, exist_ok=True)
    for line in lines:
        if line.startswith("CITUS_DIR="):
            for log in Path(line.removeprefix("CITUS_DIR=")).glob("*.log"):
                shutil.copyfile(log, into / log.name)


def _admin(url: sa.URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def _run(url: sa.URL, *statements: str) -> None:
    engine = _admin(url)
    try:
        with engine.connect() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def _rows(url: sa.URL, statement: str) -> list[tuple[Any, ...]]:
    engine = _admin(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.exec_driver_sql(statement)]
    finally:
        engine.dispose()


def rows(url: str, statement: str) -> list[tuple[Any, ...]]:
    """The rows of one statement on a node's database."""
    return _rows(sa.make_url(url), statement)
