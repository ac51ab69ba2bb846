"""Servers the tests start for themselves: a PgBouncer in front of a Postgres server (in
transaction or session mode), and a throwaway Postgres cluster that a test may restart.
Both run as the postgres user when the tests run as root (neither agrees to run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from glob import glob
from pathlib import Path
from typing import TypeVar

import pytest
import sqlalchemy as sa

T = TypeVar("T")


class NoServer(Exception):
    """The server cannot be started on this machine (the message says why)."""


def needed(server: AbstractContextManager[T]) -> Iterator[T]:
    """For a fixture: what ``server`` starts; if it cannot start, the test skips, or fails
    where Postgres tests are required (``ZERDA_STORE_REQUIRE_POSTGRES=1``, as in CI)."""
    try:
        with server as started:
            yield started
    except NoServer as exc:
        if os.environ.get("ZERDA_STORE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"cannot start a server the test needs: {exc}")
        pytest.skip(f"cannot start a server the test needs: {exc}")


def program(name: str) -> str:
    """A server program: on the PATH, else Debian's Postgres programs (any version)."""
    found = (
        shutil.which(name)
        or shutil.which(name, path="/usr/sbin")
        or max(glob(f"/usr/lib/postgresql/*/bin/{name}"), default=None)
    )
    if found is None:
        raise NoServer(f"no {name} on this machine")
    return found


def run_as() -> list[str]:
    """The command prefix that runs a server as the postgres user when we are root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise NoServer("running as root and there is no postgres user") from None
    if shutil.which("runuser") is None:
        raise NoServer("running as root and there is no runuser")
    return ["runuser", "-u", "postgres", "--"]


def give_to(folder: Path, user: str) -> None:
    account = pwd.getpwnam(user)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, account.pw_uid, account.pw_gid)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise NoServer(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")


def _wait_for_port(port: int, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise NoServer(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.05)


class PgBouncer:
    """Debian's ``pgbouncer`` in front of the Postgres server at ``server_port``: every
    database of the server is reachable through it (``* =``), each client's user must be
    listed in its auth file (``users``), trusted as the test server trusts them."""

    def __init__(
        self,
        *,
        mode: str = "transaction",
        server_port: int = 5432,
        users: tuple[str, ...] = ("postgres",),
        pool_size: int = 10,
    ) -> None:
        self.mode = mode
        self.server_port = server_port
        self.users = list(users)
        self.pool_size = pool_size
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="zerda-pgbouncer-"))
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, database: str, *, user: str = "postgres") -> str:
        """A URL of ``database`` through the pooler; in transaction mode with the store's
        option for it."""
        query = "?prepared_statements=false" if self.mode == "transaction" else ""
        return f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/{database}{query}"

    def add_user(self, user: str) -> None:
        """Let ``user`` log in through the pooler (restarted if running: the signal that
        reloads it would reach ``runuser``, not the pooler)."""
        self.users.append(user)
        self._write_users()
        if self._process is not None:
            self.restart()

    def _write_users(self) -> None:
        (self.folder / "users.txt").write_text("".join(f'"{user}" ""\n' for user in self.users))

    def start(self) -> None:
        binary, prefix = program("pgbouncer"), run_as()
        self._write_users()
        (self.folder / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.folder / 'users.txt'}\n"
            f"pool_mode = {self.mode}\ndefault_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\nserver_login_retry = 1\n"
            f"logfile = {self.folder / 'pgbouncer.log'}\n"
        )
        if prefix:
            give_to(self.folder, prefix[2])
        self._process = subprocess.Popen(
            [*prefix, binary, str(self.folder / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_port(self.port)
        except NoServer:
            self.stop()
            raise NoServer(f"pgbouncer did not start: {self.log()[-500:]}") from None

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()  # SIGTERM: immediate shutdown, clients cut off
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def restart(self) -> None:
        """Stop (cutting every client and server connection) and start on the same port."""
        self.stop()
        self.start()

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def pgbouncer(**options: object) -> Iterator[PgBouncer]:
    """A started :class:`PgBouncer`, stopped and deleted at the end."""
    bouncer = PgBouncer(**options)  # type: ignore[arg-type]
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.close()


class PrivateCluster:
    """A throwaway Postgres cluster on a port of its own (trust auth, fsync off) that a
    test may restart or stop; its admin URL is :attr:`admin_url`."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="zerda-pg-"))
        self.port = free_port()
        self.data = self.folder / "data"
        self._prefix = run_as()
        self._pg_ctl = program("pg_ctl")
        self.admin_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> None:
        if self._prefix:
            give_to(self.folder, self._prefix[2])
        init = [program("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust"]
        run([*self._prefix, *init, "-E", "UTF8", "--no-sync"])
        self.start()

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.folder / "log")
        run(
            [
                *self._prefix,
                self._pg_ctl,
                "-D",
                str(self.data),
                "-l",
                log,
                "-o",
                options,
                "-w",
                "start",
            ]
        )

    def stop(self, mode: str = "fast") -> None:
        stop = [*self._prefix, self._pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"]
        subprocess.run(stop, capture_output=True, timeout=120, check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def new_database(self) -> str:
        """A new empty database: its URL (direct)."""
        name = f"zerda_{os.urandom(6).hex()}"
        engine = sa.create_engine(
            self.admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
        )
        with engine.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        engine.dispose()
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    cluster = PrivateCluster()
    try:
        cluster.init()
        yield cluster
    finally:
        cluster.close()
