"""`db upgrade` on Postgres without long table locks: revision 0006 re-keys one session per
short transaction, holding no lock of ``entities`` that reads or writes wait for, and goes on
where it stopped after an interruption; the steps that take a table's exclusive lock wait
for it briefly and try again, so that reads do not queue behind a waiting upgrade."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import new_postgres_database
from tests.migrations.released import released_database, rows, save_turns
from zerda_store import LockTimeoutError, Store, migrate
from zerda_store.db.migration import lock_waits

pytestmark = pytest.mark.postgres

SESSIONS = {
    "a": [["Müller"], ["Muller", "Ada"]],
    "b": [["Zoë"], ["Zoe"]],
    "c": [["Jean-Luc Picard"], ["Jean Luc Picard", "Ada"]],
}
STATE = (
    "SELECT id, session_id, name_key, core_key, name, entity_type, first_seen, last_seen, "
    "first_turn_id, first_position FROM entities ORDER BY id",
    "SELECT id, session_id, entity_id, turn_id, created_at FROM contexts ORDER BY id",
    "SELECT id, session_id, kept_entity_id, merged_entity_id, reason, record::text "
    "FROM entity_merges ORDER BY id",
    "SELECT session_id, key_rules FROM session_key_rules ORDER BY session_id",
    "SELECT conname FROM pg_constraint WHERE conrelid = 'entities'::regclass ORDER BY conname",
)
FROZEN_REKEYING = "zerda_store_frozen_migrations.rekeying"
ENTITY_LOCKS = (
    "SELECT mode, granted FROM pg_locks WHERE relation = 'entities'::regclass AND pid = :pid"
)
BLOCKING_MODES = {"ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"}
WAITING_FOR_ENTITIES = (
    "SELECT COUNT(*) FROM pg_locks WHERE relation = 'entities'::regclass AND NOT granted "
    "AND mode = 'AccessExclusiveLock'"
)


class Interrupted(Exception):
    """The upgrade's process stopped."""


@pytest.fixture
def two_databases(postgres_admin: sa.Engine) -> Iterator[tuple[Store, Store]]:
    first, drop_first = new_postgres_database(postgres_admin)
    second, drop_second = new_postgres_database(postgres_admin)
    try:
        with Store(first) as one, Store(second) as other:
            for store in (one, other):
                released_database(store)
                for session_id, turns in SESSIONS.items():
                    save_turns(store, session_id, turns)
            yield one, other
    finally:
        drop_first()
        drop_second()


def _state(store: Store) -> list[list[tuple[Any, ...]]]:
    return [rows(store, query) for query in STATE]


def _wrap_rekey_session(
    monkeypatch: pytest.MonkeyPatch,
    hook: Callable[[sa.Connection, str], None],
    *,
    before: bool = False,
) -> None:
    """Call ``hook`` with the migration's connection and the session at the end (or the
    start) of each session's re-keying transaction (0006 loads its frozen modules first)."""
    module = sys.modules[FROZEN_REKEYING]
    original = module.rekey_session

    def rekey_session(connection: sa.Connection, session_id: str, *args: Any, **kw: Any) -> Any:
        if before:
            hook(connection, session_id)
        outcome = original(connection, session_id, *args, **kw)
        if not before:
            hook(connection, session_id)
        return outcome

    monkeypatch.setattr(module, "rekey_session", rekey_session)


def test_an_interrupted_rekeying_goes_on_where_it_stopped_to_the_same_end(
    two_databases: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    reference, store = two_databases
    whole = migrate.upgrade(reference)
    migrate.upgrade(store, "0005")

    def stop_at_b(connection: sa.Connection, session_id: str) -> None:
        if session_id == "b":
            raise Interrupted

    _wrap_rekey_session(monkeypatch, stop_at_b, before=True)
    with pytest.raises(Interrupted):
        migrate.upgrade(store)
    assert migrate.current_revision(store) == "0005"
    assert rows(
        store, "SELECT session_id, COUNT(*) FROM entities WHERE core_key IS NULL GROUP BY 1"
    ) == [("b", 2), ("c", 3)]
    monkeypatch.undo()

    rest = migrate.upgrade(store)

    assert [entry["session_id"] for entry in whole] == ["a", "b", "c"]
    # The rerun reports every merge of the upgrade, from the merge log: session a's too,
    # re-keyed by the stopped run (whose count of re-keyed entities was not kept).
    assert rest == [{**whole[0], "rekeyed": None}, *whole[1:]]
    assert _state(store) == _state(reference)
    migrate.check(store)


def test_rekeying_holds_no_lock_of_entities_that_reads_and_writes_wait_for(
    two_databases: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = two_databases
    migrate.upgrade(store, "0005")
    held: dict[str, list[tuple[Any, ...]]] = {}
    migrate.upgrade(store, "0006")  # loads the frozen modules
    migrate.downgrade(store, "0005")

    def probe(connection: sa.Connection, session_id: str) -> None:
        pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        held[session_id] = rows(store, ENTITY_LOCKS, pid=pid)
        with store.connect() as other, other.begin():
            # Behind a table lock of the re-keying, these would wait, then fail.
            other.exec_driver_sql("SET LOCAL lock_timeout = '100ms'")
            other.exec_driver_sql("SELECT name FROM entities WHERE name_key = 'ada'").all()
            other.exec_driver_sql(
                "INSERT INTO entities (session_id, name_key, name, entity_type, first_seen, "
                "last_seen, first_turn_id, first_position) "
                "VALUES ('other', 'x', 'x', 'unknown', 0, 0, 0, 0)"
            )
            other.rollback()

    _wrap_rekey_session(monkeypatch, probe)
    migrate.upgrade(store)

    assert sorted(held) == ["a", "b", "c"]
    for modes in held.values():
        assert ("RowExclusiveLock", True) in modes
        # The modes that conflict with reads or writes of other connections: none.
        assert {mode for mode, _ in modes}.isdisjoint(BLOCKING_MODES)


def _hold_entities(store: Store) -> sa.Connection:
    """A connection in a transaction that has read ``entities`` (an ACCESS SHARE lock,
    which an ALTER TABLE waits for), as a long request of the application."""
    holder = store.engine.connect()
    holder.begin()
    holder.exec_driver_sql("SELECT COUNT(*) FROM entities").scalar()
    return holder


def _wait_until(store: Store, query: str) -> None:
    for _ in range(600):
        if rows(store, query) != [(0,)]:
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"never true: {query}")


def test_reads_do_not_queue_behind_an_upgrade_waiting_for_a_table_lock(
    two_databases: tuple[Store, Store], caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = two_databases
    migrate.upgrade(store, "0005")
    holder = _hold_entities(store)
    failed: list[BaseException] = []

    def upgrade() -> None:
        try:
            migrate.upgrade(store)
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    upgrading = threading.Thread(target=upgrade)
    with caplog.at_level(logging.WARNING, logger="zerda_store.migrate"):
        upgrading.start()
        try:
            _wait_until(store, WAITING_FOR_ENTITIES)  # 0006's ADD COLUMN waits for the holder
            with store.connect() as reader, reader.begin():
                # Queued behind the upgrade's request, this read would wait as long as the
                # holder; the upgrade's lock_timeout (500 ms) lets it through well before its
                # own lock_timeout.
                reader.exec_driver_sql("SET LOCAL lock_timeout = '5s'")
                assert reader.exec_driver_sql("SELECT COUNT(*) FROM entities").scalar() == 8
            _wait_until(store, WAITING_FOR_ENTITIES)  # asked again
        finally:
            holder.rollback()
            holder.close()
            upgrading.join()

    assert failed == []
    assert (
        "db upgrade, the revision after 0005: a table's lock was not free within 500 ms"
        in caplog.text
    )
    assert migrate.current_revision(store) == migrate.head_revision()
    migrate.check(store)


def test_an_upgrade_that_never_gets_the_lock_gives_up_saying_so_and_changes_nothing(
    two_databases: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = two_databases
    migrate.upgrade(store, "0005")
    monkeypatch.setattr(lock_waits, "RETRY_PAUSES", (0.01, 0.01))
    holder = _hold_entities(store)
    try:
        with pytest.raises(
            LockTimeoutError, match=r"db upgrade, the revision after 0005: gave up after 3 tries"
        ):
            migrate.upgrade(store)
        assert migrate.current_revision(store) == "0005"
        assert rows(store, "SELECT to_regclass('entity_aliases') IS NULL") == [(True,)]
    finally:
        holder.rollback()
        holder.close()

    migrate.upgrade(store)

    assert migrate.current_revision(store) == migrate.head_revision()
