"""`db contract` on a Citus cluster while the application saves and recalls (runs under
``scripts/test-citus`` only): it alters the tables in the order a save locks them (entities,
then snippets), so it neither deadlocks with the saves nor fails them, and a deadlock or a
lock wait that ran out is tried again rather than reported."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.citus import Cluster
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store, migrate
from zerda_store.db.migration import contract, lock_waits

pytestmark = pytest.mark.citus

NAMES = ("Sarah Chen", "Acme Corp", "Berlin", "Omar Haddad")
WRITERS = 4
ROUNDS = 4
# The defaults `db upgrade` gives the two columns (revisions 0005 and 0006), put back so that
# the contract has something to drop in every round.
PUT_BACK = (
    "ALTER TABLE entities ALTER COLUMN core_key SET DEFAULT ''",
    "ALTER TABLE contexts ALTER COLUMN created_at "
    "SET DEFAULT EXTRACT(EPOCH FROM clock_timestamp())",
)


@pytest.fixture
def url(citus_cluster: Cluster) -> Iterator[str]:
    found, drop = citus_cluster.new_database(distributed=True)
    yield found
    drop()


class Writers:
    """Threads that save a turn naming every entity, then recall it, each in its session,
    until stopped; they count what they did and keep what failed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.stop = threading.Event()
        self.saved = 0
        self.failures: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._write, args=(n,), daemon=True) for n in range(WRITERS)
        ]

    def __enter__(self) -> Writers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)

    def _write(self, number: int) -> None:
        memory = ConversationEntityMemory(
            llm=KeywordLLM(NAMES), session_id=f"writer-{number}", store=self.store
        )
        turn = 0
        while not self.stop.is_set():
            turn += 1
            try:
                memory.save_context(
                    {"input": f"{' and '.join(NAMES)}, turn {turn}."}, {"output": "noted"}
                )
                recalled = memory.load_memory_variables({"input": "Sarah Chen?"})
                assert f"turn {turn}." in recalled[memory.memory_key]
            except BaseException as exc:  # kept: the test reports them
                with self._lock:
                    self.failures.append(exc)
                return
            with self._lock:
                self.saved += 1


@pytest.mark.fans_out  # the contract counts the entities not re-keyed, in every session
def test_db_contract_under_saves_and_recalls_drops_the_defaults_and_fails_no_call(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock_waits, "RETRY_PAUSES", (0.1,) * 20)
    contracted = []
    with Store(url) as store, Writers(store) as writers:
        admin = store.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        for _ in range(ROUNDS):
            time.sleep(0.5)
            for statement in PUT_BACK:
                admin.exec_driver_sql(statement)
            contracted.append(migrate.contract(store))
        time.sleep(0.5)
        admin.close()
    assert writers.failures == []
    assert writers.saved > ROUNDS * WRITERS
    assert contracted == [["contexts.created_at", "entities.core_key"]] * ROUNDS


def test_the_contract_alters_the_tables_in_the_order_a_save_locks_them() -> None:
    tables = [table for table, _, _ in contract.COMPATIBILITY_DEFAULTS]
    in_order = sorted(tables, key=contract.SAVE_LOCK_ORDER.index)
    assert in_order == ["entities", "contexts"]
