"""Several processes and threads writing one session: exact counts, one row and one id per
entity, no "database is locked", no deadlock (SQLite and Postgres)."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.doubles import NamesExtractor, direct_url, driver_calls
from tests.reliability import workers
from tests.reliability.helpers import inspect_database, keys_of, table_counts, turn_names
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.schema import entities
from zerda_store.model.names import name_key

PROCESSES = 4
THREADS = 2
TURNS_PER_THREAD = 30
NOTE_EVERY = 5
ENTITIES_PER_TURN = 3
# Only a guard against a hang; a healthy run takes a few seconds.
HANG_GUARD_SECONDS = 120


def _run_workers(url: str, session_id: str) -> list[dict[str, Any]]:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(
            target=workers.save_turns,
            args=(
                url,
                session_id,
                worker,
                THREADS,
                TURNS_PER_THREAD,
                NOTE_EVERY,
                start,
                results,
            ),
        )
        for worker in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        reports = [results.get(timeout=HANG_GUARD_SECONDS) for _ in processes]
        for process in processes:
            process.join(timeout=HANG_GUARD_SECONDS)
    except queue.Empty:
        pytest.fail(f"a writer process did not finish within {HANG_GUARD_SECONDS} s")
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
    assert [p.exitcode for p in processes] == [0] * PROCESSES
    return sorted(reports, key=lambda report: report["worker"])


@pytest.mark.slow
def test_processes_and_threads_share_entities_exactly(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = "crm-concurrency"
    reports = _run_workers(database_url, session_id)

    errors = [error for report in reports for error in report["errors"]]
    assert errors == []  # among them "database is locked", had any write not begun IMMEDIATE
    assert [report["retries"] for report in reports] == [0] * PROCESSES

    turn_count = PROCESSES * THREADS * TURNS_PER_THREAD
    note_count = sum(report["notes"] for report in reports)
    assert note_count == PROCESSES * THREADS * len(range(0, TURNS_PER_THREAD, NOTE_EVERY))
    with inspect_database(database_url) as connection:
        counts = table_counts(connection, session_id)
        id_by_key = dict(
            connection.execute(
                sa.select(entities.c.name_key, entities.c.id).where(
                    entities.c.session_id == session_id
                )
            ).all()
        )
    used_keys = {
        name_key(name)
        for worker in range(PROCESSES)
        for index in range(THREADS * TURNS_PER_THREAD)
        for name in turn_names(worker, index)
    }
    assert counts.turns == turn_count
    assert counts.contexts == turn_count * ENTITIES_PER_TURN + note_count
    assert counts.entities == len(used_keys)
    assert set(id_by_key) == used_keys

    # Every worker's upserts returned the one id of each entity, the id that stayed.
    key_by_id = {entity_id: key for key, entity_id in id_by_key.items()}
    for report in reports:
        worker = report["worker"]
        assert len(report["observed"]) == THREADS * TURNS_PER_THREAD
        for tag, entity_ids in report["observed"].items():
            thread, index = (int(part) for part in tag.split("-t")[1].split("-"))
            expected = keys_of(turn_names(worker, thread * TURNS_PER_THREAD + index))
            assert all(entity_id in key_by_id for entity_id in entity_ids), (tag, entity_ids)
            assert sorted(key_by_id[entity_id] for entity_id in entity_ids) == expected, tag
    with capsys.disabled():
        print(
            f"\n[concurrency {sa.make_url(database_url).get_backend_name()}] "
            f"{PROCESSES} processes x {THREADS} threads x {TURNS_PER_THREAD} turns: "
            f"turns={counts.turns} contexts={counts.contexts} entities={counts.entities} "
            f"notes={note_count} errors={len(errors)}"
        )


def test_one_turn_naming_an_entity_twice_keeps_one_entity(make_memory: Callable) -> None:
    memory = make_memory(extractor=NamesExtractor(["Alice", "alice ", "ALICE", "Bob"]))
    memory.save_context({"input": "Alice, alice and ALICE met Bob."}, {"output": "Noted."})
    assert memory.list_entities() == ["Alice", "Bob"]
    info = memory.get_entity_info("alice")
    assert info is not None
    assert info["contexts_count"] == 1
    assert memory.chat_memory[0]["entities"] == ["Alice", "Bob"]


def test_one_keyed_turn_delivered_by_many_threads_at_once_is_stored_once(
    database_url: str,
) -> None:
    deliveries = 8
    store = Store(database_url)
    memories = [
        ConversationEntityMemory(
            extractor=NamesExtractor([ADA, BO]), store=store, session_id="crm-redelivery"
        )
        for _ in range(deliveries)
    ]
    in_step = threading.Barrier(deliveries)
    errors: list[BaseException] = []

    def deliver(memory: ConversationEntityMemory) -> Callable[[], None]:
        def run() -> None:
            in_step.wait()
            memory.save_context({"input": "Ada and Bo"}, {"output": "ok"}, idempotency_key="m-1")

        return run

    threads = [_in_thread(deliver(memory), errors) for memory in memories]
    for thread in threads:
        thread.join(HANG_GUARD_SECONDS)
    store.close()
    assert errors == []
    with inspect_database(database_url) as connection:
        assert table_counts(connection, "crm-redelivery") == (1, 2, 2)


# -- lock order on Postgres ------------------------------------------------------------

# Sorted by key: ADA < BO < CY < ZED. The turns name {ADA, BO, ZED} and {ZED, CY, ADA}.
ADA, BO, CY, ZED = "Ada North", "Bo Middle", "Cy Middle", "Zed South"


@pytest.fixture
def lock_holder(postgres_url: str) -> Iterator[sa.Connection]:
    engine = sa.create_engine(direct_url(postgres_url), poolclass=sa.NullPool)
    with engine.connect() as connection:
        yield connection
    engine.dispose()


def _wait_for_lock_waiters(url: str, expected: int) -> None:
    """Block until ``expected`` sessions of this database wait for a lock."""
    engine = sa.create_engine(direct_url(url), poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    try:
        with engine.connect() as connection:
            for _ in range(1000):
                if connection.execute(query).scalar_one() >= expected:
                    return
                time.sleep(0.01)
    finally:
        engine.dispose()
    pytest.fail(f"{expected} sessions never waited for a lock")


def _lock_entities(connection: sa.Connection, session_id: str, names: list[str]) -> None:
    keys = [name_key(name) for name in names]
    rows = connection.execute(
        sa.select(entities.c.id)
        .where(entities.c.session_id == session_id, entities.c.name_key.in_(keys))
        .with_for_update()
    ).all()
    assert len(rows) == len(keys)


def _in_thread(target: Callable[[], None], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The errors after which a unit of work ran again, as the store logged them."""
    prefix = "running a unit of work again after "
    return [
        record.getMessage().removeprefix(prefix)
        for record in caplog.records
        if record.getMessage().startswith(prefix)
    ]


@pytest.mark.postgres
def test_turns_naming_entities_in_opposite_orders_do_not_deadlock(
    postgres_url: str, lock_holder: sa.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    session_id = "crm-lock-order"
    store = Store(postgres_url)

    def memory(names: list[str]) -> ConversationEntityMemory:
        extractor = NamesExtractor(names)
        return ConversationEntityMemory(extractor=extractor, store=store, session_id=session_id)

    forward, backward = memory([ADA, BO, ZED]), memory([ZED, CY, ADA])
    memory([ADA, BO, CY, ZED]).save_context({"input": "all four"}, {"output": "seeded"})

    # Hold BO and CY, so each turn stops inside its entity upsert: the forward turn after
    # taking ADA, the backward one after taking ZED if it went in input order.
    _lock_entities(lock_holder, session_id, [BO, CY])
    errors: list[BaseException] = []
    first = _in_thread(lambda: forward.save_context({"input": "forward"}, {"output": ""}), errors)
    _wait_for_lock_waiters(postgres_url, 1)
    second = _in_thread(
        lambda: backward.save_context({"input": "backward"}, {"output": ""}), errors
    )
    _wait_for_lock_waiters(postgres_url, 2)
    lock_holder.commit()
    first.join(HANG_GUARD_SECONDS)
    second.join(HANG_GUARD_SECONDS)

    assert errors == []
    assert retries(caplog) == []  # no 40P01 happened, so none had to be retried
    with inspect_database(postgres_url) as connection:
        assert table_counts(connection, session_id) == (3, 4, 4 + 3 + 3)
    store.close()


@pytest.mark.postgres
def test_the_lock_order_scenario_deadlocks_when_keys_are_not_sorted(
    postgres_url: str, lock_holder: sa.Connection
) -> None:
    """The control for the test above: the same steps with upserts in input order."""
    session_id = "crm-lock-order"
    with Store(postgres_url) as store:
        seed = ConversationEntityMemory(
            extractor=NamesExtractor([ADA, BO, CY, ZED]), store=store, session_id=session_id
        )
        seed.save_context({"input": "all four"}, {"output": "seeded"})
    upsert = sa.text(
        "INSERT INTO entities (session_id, name_key, core_key, name, entity_type, first_seen,"
        " last_seen, first_turn_id, first_position)"
        " SELECT :session_id, k, k, k, 'unknown', 0, 0, 0, 0"
        " FROM unnest(CAST(:keys AS text[])) WITH ORDINALITY AS t(k, n) ORDER BY n"
        " ON CONFLICT (session_id, name_key) DO UPDATE SET last_seen = excluded.last_seen"
    )
    engine = sa.create_engine(direct_url(postgres_url), poolclass=sa.NullPool)

    def upsert_in_input_order(names: list[str]) -> None:
        with engine.begin() as connection:
            keys = [name_key(name) for name in names]
            connection.execute(upsert, {"session_id": session_id, "keys": keys})

    _lock_entities(lock_holder, session_id, [BO, CY])
    errors: list[BaseException] = []
    first = _in_thread(lambda: upsert_in_input_order([ADA, BO, ZED]), errors)
    _wait_for_lock_waiters(postgres_url, 1)
    second = _in_thread(lambda: upsert_in_input_order([ZED, CY, ADA]), errors)
    _wait_for_lock_waiters(postgres_url, 2)
    lock_holder.commit()
    first.join(HANG_GUARD_SECONDS)
    second.join(HANG_GUARD_SECONDS)
    engine.dispose()

    assert len(errors) == 1
    assert isinstance(errors[0], sa.exc.OperationalError)
    assert isinstance(errors[0].orig, psycopg.errors.DeadlockDetected)


# -- an injected deadlock or serialization failure -------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize(
    "error",
    [psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure],
    ids=["40P01", "40001"],
)
def test_a_turn_that_hits_a_deadlock_is_retried_whole_without_duplicates(
    postgres_url: str, error: type[psycopg.Error], caplog: pytest.LogCaptureFixture
) -> None:
    session_id = f"crm-{uuid.uuid4().hex[:8]}"
    memory = ConversationEntityMemory(
        extractor=NamesExtractor([ADA, BO, ZED]), database_url=postgres_url, session_id=session_id
    )
    injected: list[str] = []

    def fail_once(_cursor: Any, statement: str, _parameters: Any) -> None:
        if statement.startswith("INSERT INTO contexts") and not injected:
            injected.append(statement)
            raise error("injected by the test")

    with driver_calls(memory.store.engine, before_statement=fail_once) as statements:
        memory.save_context({"input": "Ada, Bo and Zed signed."}, {"output": "Great."})
    memory.close()

    assert len(injected) == 1
    assert retries(caplog) == [error.__name__]
    turn_inserts = [s for s, _ in statements if s.startswith("INSERT INTO turns")]
    assert len(turn_inserts) == 2  # the whole turn ran again, from its first statement
    with inspect_database(postgres_url) as connection:
        assert table_counts(connection, session_id) == (1, 3, 3)


@pytest.mark.postgres
def test_a_repair_that_hits_a_deadlock_is_retried_whole(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """reextract runs in a Core transaction with compiled inserts inside it: their driver
    errors must come out as SQLAlchemy's, so that a deadlock is retried there too."""
    session_id = f"crm-{uuid.uuid4().hex[:8]}"
    extractor = NamesExtractor([ADA, BO])
    memory = ConversationEntityMemory(
        extractor=extractor, database_url=postgres_url, session_id=session_id
    )
    extractor.names = None  # type: ignore[assignment]  (extract() raises: the turn fails)
    memory.save_context({"input": "Ada and Bo signed."}, {"output": "Great."})
    extractor.names = [ADA, BO]
    injected: list[str] = []

    def fail_once(_cursor: Any, statement: str, _parameters: Any) -> None:
        if statement.startswith("INSERT INTO entities") and not injected:
            injected.append(statement)
            raise psycopg.errors.DeadlockDetected("injected by the test")

    with driver_calls(memory.store.engine, before_statement=fail_once):
        assert memory.reextract() == {"repaired": 1, "failed": 0}
    memory.close()

    assert len(injected) == 1
    assert retries(caplog) == ["DeadlockDetected"]
    with inspect_database(postgres_url) as connection:
        assert table_counts(connection, session_id) == (1, 2, 2)
