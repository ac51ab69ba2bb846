"""A running service through a Postgres restart, a pooler restart, and connections the
server ends (``pg_terminate_backend``, ``idle_session_timeout``), on the direct URL and
through PgBouncer in transaction mode: calls in flight fail with a StoreError (or are run
again where that is safe), every later call works, and no acknowledged turn is lost or
stored twice (each save carries an idempotency key, and is delivered again until it is
acknowledged, as a client retries)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from tests import servers
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store, StoreError, migrate

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

NAMES = ["Omar", "Layla", "Riyadh"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[servers.PrivateCluster]:
    yield from servers.needed(servers.private_cluster())


@pytest.fixture(scope="module")
def bouncer(cluster: servers.PrivateCluster) -> Iterator[servers.PgBouncer]:
    yield from servers.needed(
        servers.pgbouncer(mode="transaction", server_port=cluster.port, pool_size=4)
    )


@pytest.fixture(params=["direct", "pooled"])
def route(request: pytest.FixtureRequest, cluster: servers.PrivateCluster) -> tuple[str, str]:
    """(the URL the service uses, the database's direct URL), on a new database at head."""
    url = cluster.new_database()
    with Store(url) as store:
        migrate.upgrade(store)
    if request.param == "direct":
        return url, url
    bouncer: servers.PgBouncer = request.getfixturevalue("bouncer")
    return bouncer.url(str(sa.make_url(url).database)), url


class Service:
    """Threads saving keyed turns and recalling them through one store, until stopped; each
    save is delivered again (same key) until acknowledged."""

    def __init__(self, url: str, threads: int = 3) -> None:
        self.store = Store(url, lock_timeout=2.0)
        self.acknowledged: list[str] = []
        self.failures: list[BaseException] = []
        self.unexpected: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._serve, args=(n,)) for n in range(threads)]

    def __enter__(self) -> Service:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        self.store.close()

    def _serve(self, number: int) -> None:
        memory = ConversationEntityMemory(
            llm=KeywordLLM(NAMES), store=self.store, session_id=f"customer-{number}"
        )
        turn = 0
        while not self._stop.is_set():
            key = f"{number}-{turn}"
            try:
                memory.save_context(
                    {"input": f"Omar asked about Riyadh ({key})"},
                    {"output": "ok"},
                    idempotency_key=key,
                )
                self.acknowledged.append(key)
                turn += 1
                recalled = memory.load_memory_variables({"input": "Omar"})["entity_info"]
                assert f"({key})" in recalled, recalled
            except StoreError as exc:
                self.failures.append(exc)
                time.sleep(0.05)
            except BaseException as exc:
                self.unexpected.append(exc)
                return

    def served(self) -> int:
        return len(self.acknowledged)


def _wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the service stopped serving"
        time.sleep(0.05)


def _through(url: str, disruption: Callable[[], None]) -> Service:
    with Service(url) as service:
        _wait_for(lambda: service.served() >= 20)
        disruption()
        after = service.served()
        _wait_for(lambda: service.served() >= after + 30)  # every later call works
    return service


def _check_nothing_lost_or_doubled(service: Service, direct: str) -> None:
    assert service.unexpected == []
    engine = sa.create_engine(direct, poolclass=sa.NullPool)
    with engine.connect() as connection:
        keys = [row[0] for row in connection.exec_driver_sql("SELECT idempotency_key FROM turns")]
    engine.dispose()
    assert len(keys) == len(set(keys))  # none stored twice
    assert set(service.acknowledged) <= set(keys)  # none acknowledged and lost
    # A save that failed as its commit's outcome was unknown may be stored (its retry then
    # found its key); nothing else is.
    assert len(keys) - len(service.acknowledged) <= len(service.failures)


def test_a_postgres_restart_under_a_running_service(
    route: tuple[str, str], cluster: servers.PrivateCluster
) -> None:
    url, direct = route
    service = _through(url, cluster.restart)
    _check_nothing_lost_or_doubled(service, direct)


def test_a_pooler_restart_under_a_running_service(
    bouncer: servers.PgBouncer, cluster: servers.PrivateCluster
) -> None:
    direct = cluster.new_database()
    with Store(direct) as store:
        migrate.upgrade(store)
    service = _through(bouncer.url(str(sa.make_url(direct).database)), bouncer.restart)
    _check_nothing_lost_or_doubled(service, direct)


def test_connections_the_server_terminates_under_a_running_service(
    route: tuple[str, str],
) -> None:
    url, direct = route
    database = str(sa.make_url(direct).database)
    admin = sa.create_engine(direct, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")

    def terminate() -> None:
        with admin.connect() as connection:
            for _ in range(3):
                connection.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
                )
                time.sleep(0.2)

    service = _through(url, terminate)
    admin.dispose()
    _check_nothing_lost_or_doubled(service, direct)


def test_idle_connections_the_server_ends_are_replaced(route: tuple[str, str]) -> None:
    url, direct = route
    database = str(sa.make_url(direct).database)
    admin = sa.create_engine(direct, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(
            f"ALTER DATABASE \"{database}\" SET idle_session_timeout = '300ms'"
        )
    admin.dispose()
    with Store(url) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store)
        for turn in range(4):
            memory.save_context(
                {"input": f"Layla ({turn})"}, {"output": "ok"}, idempotency_key=str(turn)
            )
            time.sleep(0.6)  # every connection idle past the timeout: the server ends it
            assert f"({turn})" in memory.load_memory_variables({"input": "Layla"})["entity_info"]
    engine = sa.create_engine(direct, poolclass=sa.NullPool)
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM turns").scalar() == 4
    engine.dispose()
