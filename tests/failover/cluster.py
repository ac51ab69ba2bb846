"""A throwaway pg_auto_failover formation on this machine: a monitor, a primary and a
synchronous standby, each a ``pg_autoctl`` process (with its Postgres) in a process group
of its own, on free local ports in a temporary folder.

Postgres refuses to run as root, so as root the processes run as the ``postgres`` user.
Everything is killed and deleted on the way out, whatever happened.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import Any

import psycopg

# The monitor's failure detection, made fast for a test (the defaults take 30-60 s). In
# production keep primary_demote_timeout above the keepers' network_partition_timeout
# (20 s), so that a primary cut off from the monitor has demoted itself before a standby
# is promoted; here the primary is killed outright, so no split brain can happen.
FAST_FAILOVER = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 2000,
    "pgautofailover.primary_demote_timeout": 2000,
}
DATABASE = "zerda"
SETUP_SECONDS = 180


class ClusterError(Exception):
    """The formation could not be set up."""


@dataclass
class Node:
    """One ``pg_autoctl`` service (a data node or the monitor) and its Postgres."""

    name: str
    port: int
    pgdata: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def kill(self) -> None:
        """SIGKILL the node's whole process group (keeper, Postgres and its backends), and a
        Postgres that left the group, if any."""
        if self.process is not None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        postmaster = self.pgdata / "postmaster.pid"
        try:
            pid = int(postmaster.read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


@dataclass
class Cluster:
    """The formation's monitor and data nodes; ``url`` reaches whichever node is primary."""

    workdir: Path
    monitor: Node
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def states(self) -> dict[str, tuple[str, str]]:
        """Each data node's reported and assigned state, as the monitor has them."""
        with _connect(self.monitor.port, "pg_auto_failover") as connection:
            rows = connection.execute(
                "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node"
            ).fetchall()
        return {name: (reported, goal) for name, reported, goal in rows}

    def wait_for(self, wanted: dict[str, str], timeout: float = SETUP_SECONDS) -> None:
        """Wait until every named node reports the wanted state; meanwhile ask the primary
        for checkpoints (pg_basebackup of a new standby waits for one, spread over minutes
        by default)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                states = self.states()
            except psycopg.Error:
                states = {}
            if all(states.get(name, ("", ""))[0] == state for name, state in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"nodes did not reach {wanted} in {timeout:g} s: {states}")
            self._checkpoint_primary()
            time.sleep(0.5)

    def _checkpoint_primary(self) -> None:
        for node in self.nodes:
            try:
                with _connect(node.port, "postgres") as connection:
                    if not connection.execute("SELECT pg_is_in_recovery()").fetchone()[0]:  # type: ignore[index]
                        connection.execute("CHECKPOINT")
            except psycopg.Error:
                continue


@contextmanager
def formation() -> Iterator[Cluster]:
    """A monitor, a primary and a synchronous standby, ready; killed and deleted at the end."""
    autoctl, pg_ctl = _programs()
    workdir = Path(tempfile.mkdtemp(prefix="zerda-failover-"))
    owner = _owner()
    cluster = Cluster(workdir, _node("monitor", workdir))
    try:
        if owner is not None:
            os.chown(workdir, owner.pw_uid, owner.pw_gid)
        environment = _environment(workdir, owner)
        monitor = cluster.monitor
        _start(
            monitor,
            [autoctl, "create", "monitor", *_common(monitor, pg_ctl), "--run"],
            environment,
            owner,
        )
        _wait_for_monitor(cluster)
        _tune_monitor(monitor.port)
        monitor_url = (
            f"postgresql://autoctl_node@127.0.0.1:{monitor.port}/pg_auto_failover?sslmode=disable"
        )
        for index, name in enumerate(("node1", "node2")):
            node = _node(name, workdir)
            cluster.nodes.append(node)
            command = [
                autoctl,
                "create",
                "postgres",
                *_common(node, pg_ctl),
                "--monitor",
                monitor_url,
                "--name",
                name,
                "--dbname",
                DATABASE,
                "--run",
            ]
            _start(node, command, environment, owner)
            if index == 0:
                cluster.wait_for({"node1": "single"})
        cluster.wait_for({"node1": "primary", "node2": "secondary"})
        yield cluster
    finally:
        for node in [*cluster.nodes, cluster.monitor]:
            node.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def _programs() -> tuple[str, str]:
    autoctl = shutil.which("pg_autoctl")
    if autoctl is None:
        raise ClusterError(
            "pg_autoctl is not installed: apt-get install postgresql-15-auto-failover"
        )
    # The Postgres whose lib folder holds the monitor's extension.
    found = sorted(glob("/usr/lib/postgresql/*/lib/pgautofailover.so"))
    if not found:
        raise ClusterError("no pgautofailover extension found under /usr/lib/postgresql")
    pg_ctl = str(Path(found[-1]).parent.parent / "bin" / "pg_ctl")
    return autoctl, pg_ctl


def _owner() -> pwd.struct_passwd | None:
    """The user the nodes run as: postgres when running as root, else the current user."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ClusterError("running as root and there is no postgres user") from None


def _environment(workdir: Path, owner: pwd.struct_passwd | None) -> dict[str, str]:
    """pg_autoctl keeps its configuration and state under the XDG folders: all in workdir."""
    folders = {
        "HOME": workdir,
        "XDG_CONFIG_HOME": workdir / "config",
        "XDG_DATA_HOME": workdir / "data",
        "XDG_RUNTIME_DIR": workdir / "run",
    }
    for folder in folders.values():
        folder.mkdir(exist_ok=True)
        if owner is not None:
            os.chown(folder, owner.pw_uid, owner.pw_gid)
    keep = {key: os.environ[key] for key in ("PATH", "LANG", "LC_ALL") if key in os.environ}
    return {**keep, **{key: str(path) for key, path in folders.items()}}


def _node(name: str, workdir: Path) -> Node:
    return Node(name, _free_port(), workdir / name, workdir / f"{name}.log")


def _common(node: Node, pg_ctl: str) -> list[str]:
    return [
        "--pgdata",
        str(node.pgdata),
        "--pgport",
        str(node.port),
        "--pgctl",
        pg_ctl,
        "--hostname",
        "127.0.0.1",
        "--auth",
        "trust",
        "--no-ssl",
    ]


def _start(
    node: Node, command: list[str], environment: dict[str, str], owner: pwd.struct_passwd | None
) -> None:
    """Start ``command`` in a new process group (so that one kill ends the node)."""
    user: dict[str, Any] = {}
    if owner is not None:
        user = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
    with node.log.open("wb") as log:
        node.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=node.log.parent,
            start_new_session=True,
            **user,
        )


def _wait_for_monitor(cluster: Cluster) -> None:
    deadline = time.monotonic() + SETUP_SECONDS
    while True:
        try:
            cluster.states()
            return
        except psycopg.Error as exc:
            process = cluster.monitor.process
            if process is not None and process.poll() is not None:
                raise ClusterError(f"the monitor exited: {_tail(cluster.monitor.log)}") from exc
            if time.monotonic() > deadline:
                raise ClusterError(f"the monitor did not start: {exc}") from exc
            time.sleep(0.3)


def _tune_monitor(port: int) -> None:
    with _connect(port, "pg_auto_failover") as connection:
        for name, value in FAST_FAILOVER.items():
            connection.execute(f"ALTER SYSTEM SET {name} = {value}")
        connection.execute("SELECT pg_reload_conf()")


def _connect(port: int, database: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1",
        port=port,
        user="postgres",
        dbname=database,
        connect_timeout=3,
        autocommit=True,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tail(log: Path, lines: int = 5) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
