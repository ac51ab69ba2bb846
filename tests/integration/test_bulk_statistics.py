"""A bulk write leaves the memory's tables analysed on Postgres (``db.statistics``), as
``pg_restore``'s users are told to: a large ``save_contexts`` and a large import do; a
small one leaves it to autovacuum. Autovacuum is off on the test's database, so what is
analysed was analysed by the store."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import ListedNames
from zerda_store import AdminRepository, ConversationEntityMemory, Store
from zerda_store.db import statistics
from zerda_store.db.schema import metadata

pytestmark = pytest.mark.postgres

BULK = statistics.BULK_ROWS


def _pairs(first: int, count: int) -> list[tuple[dict[str, str], dict[str, str]]]:
    return [
        ({"input": f"Ada, Contact {t % 50} | "}, {"output": f"turn {t}"})
        for t in range(first, first + count)
    ]


def _memory(url: str, session_id: str = "bulk") -> ConversationEntityMemory:
    memory = ConversationEntityMemory(
        database_url=url, session_id=session_id, extractor=ListedNames()
    )
    with memory.store.engine.begin() as connection:
        for table in metadata.sorted_tables:
            connection.exec_driver_sql(f"ALTER TABLE {table.name} SET (autovacuum_enabled = false)")
    return memory


def _analysed(engine: sa.Engine) -> dict[str, Any]:
    """The tables analysed so far, with when. (Not how many rows changed since: the
    writing connection may report its inserts after the analysis.)"""
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT relname, coalesce(last_analyze, last_autoanalyze) AS analysed"
            " FROM pg_stat_user_tables"
            " WHERE last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL"
        )
        return {row.relname: row.analysed for row in rows}


def test_a_bulk_save_contexts_leaves_the_tables_analysed(postgres_url: str) -> None:
    memory = _memory(postgres_url)
    engine = memory.store.engine

    memory.save_contexts(_pairs(0, 10))
    assert _analysed(engine) == {}  # a small batch: left to autovacuum

    memory.save_contexts(_pairs(10, BULK))

    analysed = _analysed(engine)
    assert {"turns", "entities", "contexts", "extractions"} <= set(analysed), analysed
    memory.close()


def test_a_bulk_import_leaves_the_tables_analysed(postgres_url: str) -> None:
    memory = _memory(postgres_url)
    engine = memory.store.engine
    for first in range(0, 600, 200):  # small batches: nothing analysed yet
        memory.save_contexts(_pairs(first, 200))
    admin = AdminRepository(memory.store)
    records = list(admin.export_session("bulk"))
    assert len(records) >= BULK and _analysed(engine) == {}

    admin.import_session("imported", records)

    analysed = _analysed(engine)
    assert {"turns", "entities", "contexts"} <= set(analysed), analysed
    memory.close()


def test_a_prune_analyses_tables_that_were_never_analysed(postgres_url: str) -> None:
    """The fourth hardening round, H10: a prune on tables that were written in small
    batches and never analysed (autovacuum off, or not there yet) analyses them before it
    reads whole sessions; tables with statistics are left to autovacuum."""
    memory = _memory(postgres_url)
    engine = memory.store.engine
    for first in range(0, 1_200, 400):  # below a bulk write: no analysis afterwards
        memory.save_contexts(_pairs(first, 400))
    memory.set_retention(keep_last=2)
    memory.close()
    assert _analysed(engine) == {}

    with Store(postgres_url) as store:
        receipt = AdminRepository(store).prune("bulk")
        assert receipt["snippets"] > 0
        analysed = _analysed(store.engine)
        assert {"contexts", "turns", "entities"} <= set(analysed)

        AdminRepository(store).prune("bulk")
        assert _analysed(store.engine) == analysed  # analysed once, not at every prune
