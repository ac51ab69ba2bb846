"""The Citus test mode: with ``ZERDA_TEST_CITUS_URL`` (the admin URL of a running coordinator,
as ``scripts/citus start`` prints it), the Postgres databases of the suites are made on every
node of the cluster, at head and distributed by ``db distribute``.

Creating a database on three nodes, adding the nodes and distributing eight tables costs about
two seconds; each test's database is a copy of a template made once per run on every node
(Citus keeps its metadata in the database itself, and every node's copy has the same shards,
so the copies form a cluster of their own). The store's connections are strict: the
coordinator refuses any statement of theirs that would run on more than one shard
(``citus.multi_task_query_log_level = error``), unless the test is marked ``fans_out`` (an
operation over every session).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa

from zerda_store import Store, migrate

CITUS_URL = os.environ.get("ZERDA_TEST_CITUS_URL")
SHARDS = 4
# The lowest revision a distributed database goes down to: below it the primary keys lack
# session_id, which Citus refuses on distributed tables (docs/citus.md).
LOWEST_REVISION = "0007"
# What the store's connections send in the Citus mode: a statement on more than one shard
# fails. (The tests' own connections, which may read every session to check a result, do
# not send it.)
STRICT_OPTION = "-c citus.multi_task_query_log_level=error"


class Cluster:
    """A coordinator and its workers (read from ``pg_dist_node``), with one template database
    on every node for each kind of test database: empty (the extension and the nodes only) and
    distributed (at head, ``db distribute`` run)."""

    def __init__(self, coordinator_url: str) -> None:
        self.url = sa.make_url(coordinator_url)
        self.coordinator = _admin(self.url)
        with self.coordinator.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT nodename, nodeport FROM pg_dist_node ORDER BY groupid")
            ).all()
        if len(rows) < 2:
            raise RuntimeError(f"{self.url!r} is not a coordinator with workers")
        (self.host, self.port), *workers = [(host, int(port)) for host, port in rows]
        self.workers = [_admin(self.url.set(host=h, port=p)) for h, p in workers]
        self.nodes = [self.coordinator, *self.workers]
        self.workers_at = workers
        self._templates: dict[bool, str] = {}
        self._pool = ThreadPoolExecutor(len(self.nodes))

    def new_database(self, *, distributed: bool) -> tuple[str, Callable[[], None]]:
        """A new database on every node, copied from the template; its URL and a drop."""
        name = f"zerda_test_{uuid.uuid4().hex[:12]}"
        self.copy_template(name, distributed=distributed)
        return self.url_of(name), lambda: self.drop(name)

    def copy_template(self, name: str, *, distributed: bool) -> None:
        """Create ``name`` on every node as a copy of the template."""
        template = self._template(distributed)
        self._on_every_node(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')

    def url_of(self, name: str) -> str:
        return self.url.set(database=name).render_as_string(hide_password=False)

    def drop(self, name: str) -> None:
        """Drop ``name`` on the coordinator, then on the workers (whose connections from the
        coordinator are gone by then; a Citus daemon may still hold one for a moment)."""
        statement = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
        _run_again_while_in_use(self.coordinator, statement)
        futures = [
            self._pool.submit(_run_again_while_in_use, node, statement) for node in self.workers
        ]
        for future in futures:
            future.result()

    def _on_every_node(self, statement: str) -> None:
        """Run a statement on the nodes at once (each waits mostly for its own disk)."""
        futures = [self._pool.submit(_run, node, statement) for node in self.nodes]
        for future in futures:
            future.result()

    def close(self) -> None:
        for name in self._templates.values():
            self.drop(name)
        for node in self.nodes:
            node.dispose()
        self._pool.shutdown()

    def prepare(self) -> None:
        """Make both templates now (once per run)."""
        for distributed in (False, True):
            self._template(distributed)

    def _template(self, distributed: bool) -> str:
        if distributed not in self._templates:
            name = (
                f"zerda_template_{'distributed' if distributed else 'empty'}_{uuid.uuid4().hex[:8]}"
            )
            self._templates[distributed] = name
            self._make_template(name, distributed)
        return self._templates[distributed]

    def _make_template(self, name: str, distributed: bool) -> None:
        for node in self.nodes:
            _run(node, f'CREATE DATABASE "{name}"')
            with _admin(self.url.set(**_node_address(node), database=name)).connect() as c:
                c.exec_driver_sql("CREATE EXTENSION citus")
        with _admin(self.url.set(database=name)).connect() as connection:
            connection.exec_driver_sql(
                f"SELECT citus_set_coordinator_host('{self.host}', {self.port})"
            )
            for host, port in self.workers_at:
                connection.exec_driver_sql(f"SELECT citus_add_node('{host}', {port})")
        if distributed:
            # Few shards: a copy of the template costs a file per shard and index on every
            # node, and two shards per worker are enough for a fan-out to show.
            _run(self.coordinator, f'ALTER DATABASE "{name}" SET citus.shard_count = {SHARDS}')
            with Store(self.url_of(name)) as store:
                migrate.upgrade(store)
                migrate.distribute(store)
        # A template takes no connections: Citus's own (its maintenance daemon, the cached
        # connections between the nodes) would stop the copies.
        for node in self.nodes:
            _run(node, f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
            _run(
                node,
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
            )


def _admin(url: sa.URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def _node_address(engine: sa.Engine) -> dict[str, object]:
    return {"host": engine.url.host, "port": engine.url.port}


def _run_again_while_in_use(engine: sa.Engine, statement: str, attempts: int = 20) -> None:
    for attempt in range(attempts):
        try:
            _run(engine, statement)
            return
        except sa.exc.OperationalError as exc:
            if "is being accessed by other users" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.1)


def _run(engine: sa.Engine, statement: str) -> None:
    with engine.connect() as connection:
        connection.exec_driver_sql(statement)


def strict(engine_options: Callable[..., Any]) -> Callable[..., Any]:
    """``engine_options`` of zerda_store's engines, with :data:`STRICT_OPTION` added to
    every Postgres connection (after the URL's own ``options``, which it would replace)."""

    def options(url: sa.URL, *args: Any) -> tuple[sa.URL, dict[str, Any]]:
        driver_url, found = engine_options(url, *args)
        if driver_url.get_backend_name() == "postgresql":
            own = driver_url.query.get("options", "")
            own = " ".join(own) if isinstance(own, tuple) else own
            found.setdefault("connect_args", {})["options"] = f"{own} {STRICT_OPTION}".strip()
        return driver_url, found

    return options


# A call of the save function as the coordinator sends it (``turns.delegated``): a turn of the
# session 'acme' naming Acme Corp and Berlin, its rows' ids from ``turn`` up.
SAVE_CALL = (
    "SELECT * FROM zerda_save_turn_v1('acme', 'Acme Corp and Berlin', 'ok', "
    "'[\"Acme Corp\", \"Berlin\"]'::json, 9.0, NULL, 'llm', 'ok', NULL, 1.0, 2, 1, "
    "9.0, ARRAY['acme corp', 'berlin'], ARRAY['acme', 'berlin'], "
    "ARRAY['Acme Corp', 'Berlin'], ARRAY['ORG', 'LOC'], ARRAY[0, 1], "
    "'Acme Corp and Berlin', 9.0, {turn}, ARRAY[{turn} + 1, {turn} + 2], "
    "ARRAY[{turn} + 3, {turn} + 4], {turn} + 5, 5000)"
)
