"""Operations on sessions larger than a statement's bind-parameter limit: forgetting an
entity named in 100,000 turns and importing 70,000 keyed turns work on both backends.

Postgres's wire protocol takes at most 65,535 parameters a statement. SQLite takes 32,766
by default (since 3.32); some builds raise it (this Python's allows 250,000), so the
SQLite stores here lower it back to the default on every connection they open.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import FixedLLM
from tests.reliability.helpers import inspect_database, row_counts, table_counts
from zerda_store import ConversationEntityMemory, Store, StoreError
from zerda_store.admin import AdminRepository
from zerda_store.db.schema import turns

SQLITE_VARIABLE_LIMIT = 32_766
MANY_TURNS = 100_000  # over both limits
IMPORTED_TURNS = 70_000  # over both limits, with one idempotency key each
FORGOTTEN, KEPT = "Omar Haddad", "Globex"
SESSION = "crm-large"


def _lower_variable_limit(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_VARIABLE_LIMIT)


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    """A store on the test's database; on SQLite every connection takes at most 32,766
    parameters a statement."""
    store = Store(database_url)
    if store.dialect == "sqlite":
        sa.event.listen(store.engine, "connect", _lower_variable_limit)
        with store.connect() as connection:
            limit = connection.connection.driver_connection.getlimit(  # type: ignore[union-attr]
                sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER
            )
        assert limit == SQLITE_VARIABLE_LIMIT
    yield store
    store.close()


@contextmanager
def briefly_reported() -> Iterator[None]:
    """A database error as one line: the text of a statement with 100,000 parameters runs
    to megabytes, too much for a test report."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        statement = " ".join(str(exc.statement).split())[:100]
        message = f"{type(exc).__name__}: {exc.orig} (in {statement} …)"
        raise pytest.fail.Exception(message, pytrace=False) from None


def _memory(store: Store, names: str, session_id: str = SESSION) -> ConversationEntityMemory:
    return ConversationEntityMemory(llm=FixedLLM(names), store=store, session_id=session_id)


def _save_turns(memory: ConversationEntityMemory, count: int) -> None:
    """``count`` turns in one transaction (a few seconds for 100,000 on either backend)."""
    saved = memory.save_contexts(
        ({"input": f"Turn {i}: {FORGOTTEN} called {KEPT}."}, {"output": "Noted."})
        for i in range(count)
    )
    assert saved == count


def _entity_names_of_turns(url: str, session_id: str) -> Counter[tuple[str, ...]]:
    with inspect_database(url) as connection:
        rows = connection.execute(
            sa.select(turns.c.entity_names).where(turns.c.session_id == session_id)
        ).scalars()
        return Counter(tuple(names) for names in rows)


@pytest.mark.slow
def test_forgetting_an_entity_named_in_100000_turns_drops_its_name_from_them(
    database_url: str, store: Store
) -> None:
    memory = _memory(store, f"{FORGOTTEN}, {KEPT}")
    _save_turns(memory, MANY_TURNS)

    with briefly_reported():
        receipt = memory.forget_entity(FORGOTTEN)

    assert receipt == {
        "entity": FORGOTTEN,
        "entities": 1,
        "contexts": MANY_TURNS,
        "turns_deleted": 0,
        "turns_updated": MANY_TURNS,
    }
    assert memory.list_entities() == [KEPT]
    assert _entity_names_of_turns(database_url, SESSION) == {(KEPT,): MANY_TURNS}
    with inspect_database(database_url) as connection:
        assert table_counts(connection, SESSION) == (MANY_TURNS, 1, MANY_TURNS)


@pytest.mark.slow
def test_forgetting_an_entity_with_its_100000_turns_deletes_them_all(
    database_url: str, store: Store
) -> None:
    _save_turns(_memory(store, f"{FORGOTTEN}, {KEPT}"), MANY_TURNS)
    # One more turn names only the other entity, so it stays (with this one turn).
    memory = _memory(store, KEPT)
    memory.save_context({"input": f"{KEPT} renewed."}, {"output": "Great."})

    with briefly_reported():
        receipt = memory.forget_entity(FORGOTTEN, with_turns=True)

    assert receipt == {
        "entity": FORGOTTEN,
        "entities": 1,
        "contexts": 2 * MANY_TURNS,
        "turns_deleted": MANY_TURNS,
        "turns_updated": 0,
    }
    assert memory.list_entities() == [KEPT]
    assert _entity_names_of_turns(database_url, SESSION) == {(KEPT,): 1}
    with inspect_database(database_url) as connection:
        counts = row_counts(connection)
    assert {table: counts[table] for table in ("turns", "entities", "contexts", "extractions")} == {
        "turns": 1,
        "entities": 1,
        "contexts": 1,
        "extractions": 1,
    }


def _keyed_export(database_url: str, store: Store, session_id: str) -> list[dict[str, Any]]:
    """The records ``export_session`` gives for a session of ``IMPORTED_TURNS`` turns, each
    with an idempotency key (as a chat front end's message ids would be)."""
    _save_turns(_memory(store, FORGOTTEN, session_id), IMPORTED_TURNS)
    with inspect_database(database_url) as connection:
        connection.execute(
            sa.update(turns)
            .where(turns.c.session_id == session_id)
            .values(idempotency_key=sa.literal("message-") + sa.cast(turns.c.id, sa.String))
        )
        connection.commit()
    return list(AdminRepository(store).export_session(session_id))


@pytest.mark.slow
def test_importing_70000_keyed_turns_works_and_a_second_import_is_refused(
    database_url: str, store: Store
) -> None:
    records = _keyed_export(database_url, store, "crm-source")
    assert sum(1 for r in records if r["kind"] == "turn" and r["idempotency_key"]) == (
        IMPORTED_TURNS
    )
    admin = AdminRepository(store)

    with briefly_reported():
        counts = admin.import_session("crm-copy", records)

    assert counts == {"turns": IMPORTED_TURNS, "entities": 1, "contexts": IMPORTED_TURNS}
    with inspect_database(database_url) as connection:
        assert table_counts(connection, "crm-copy") == (IMPORTED_TURNS, 1, IMPORTED_TURNS)
        keys = connection.execute(
            sa.select(sa.func.count(sa.distinct(turns.c.idempotency_key))).where(
                turns.c.session_id == "crm-copy"
            )
        ).scalar_one()
        assert keys == IMPORTED_TURNS

    # The same file again, merged: it was merged before (its first turn is there, and every
    # key is used already), so nothing is imported.
    with briefly_reported(), pytest.raises(StoreError, match="the file was merged before"):
        admin.import_session("crm-copy", records, merge=True)
    with inspect_database(database_url) as connection:
        assert table_counts(connection, "crm-copy") == (IMPORTED_TURNS, 1, IMPORTED_TURNS)
