"""`copy --to` of a large session streams in batches: a statement carries up to 512 rows
(64 on SQLite); and on Postgres each row's foreign-key check stays one index lookup however
many turns the copy has written in its one transaction (planned once, while a new
database's tables were nearly empty, the checks read every turn of the session so far:
quadratic work). Measured in statements and rows read, not in time."""

from __future__ import annotations

import math
import time

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of, url_maker
from tests.doubles import KeywordLLM, new_postgres_database
from zerda_store.db.execution import unit_of_work
from zerda_store.transfer.importing import IMPORT_BATCH
from zerda_store.turns.statements import ROWS_PER_STATEMENT

TURNS = 3_000


def filled(url: str, turns: int = TURNS) -> str:
    """A session "big" of ``turns`` turns naming Acme Corp (one snippet each)."""
    with url_maker(url)(KeywordLLM(["Acme Corp"]), session_id="big") as memory:
        memory.save_contexts(
            ({"input": f"Turn {n}: Acme Corp asked for a quote."}, {"output": "ok"})
            for n in range(turns)
        )
    return url


def turn_table_reads(url: str, inserted: int) -> int:
    """Rows of ``turns`` read (by scans and through indexes), once the copying
    connections have reported their counts (when they close; waited for by the rows they
    inserted)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            for _ in range(300):
                connection.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
                row = connection.exec_driver_sql(
                    "SELECT n_tup_ins, seq_tup_read + idx_tup_fetch AS read FROM pg_stat_user_tables "
                    "WHERE relname = 'turns'"
                ).one()
                if row.n_tup_ins >= inserted:
                    return int(row.read)
                time.sleep(0.1)
            raise AssertionError("the copy's table statistics were never reported")
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_copy_twice_as_large_reads_a_turn_more_per_foreign_key_check(tmp_path, postgres_admin):
    reads = {}
    for turns in (TURNS // 2, TURNS):
        source = filled(f"sqlite:///{tmp_path / f'{turns}.db'}", turns)
        target, drop = new_postgres_database(postgres_admin)
        try:
            assert json_of(invoke(source, "copy", "--to", target, "--json"))["copied"] == 1
            reads[turns] = turn_table_reads(target, turns)
        finally:
            drop()

    # The second half: one lookup per ledger row and per snippet (and whatever the first
    # few batches cost, the same in both). Read by the session alone, the checks read
    # every turn so far: 3.4 million more.
    assert reads[TURNS] - reads[TURNS // 2] <= 4 * (TURNS // 2)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}"
    return str(request.getfixturevalue("postgres_url"))


def test_a_copy_writes_a_batch_of_rows_a_statement(sqlite_url, target, monkeypatch):
    source = filled(sqlite_url)
    statements = 0
    run = unit_of_work.Transaction.run

    def counted(self, statement, values=None):
        nonlocal statements
        statements += 1
        return run(self, statement, values)

    monkeypatch.setattr(unit_of_work.Transaction, "run", counted)
    before = statements
    report = json_of(invoke(source, "copy", "--to", target, "--json"))

    assert report == {"copied": 1, "skipped": 0, "default_rules": 0, "session_rules": 0}
    # Turns, their ledger rows and snippets: a statement per batch of each, plus the
    # entity and a handful of checks and locks (reads of the source included).
    per_statement = IMPORT_BATCH if target.startswith("postgresql") else ROWS_PER_STATEMENT
    assert statements - before <= 3 * math.ceil(TURNS / per_statement) + 30
