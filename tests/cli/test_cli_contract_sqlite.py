"""`db contract` on SQLite (the fourth hardening round, H16): it waits a bounded time for
another writer and then says so, and a file it cannot write is named as such, never a
raw database error."""

from __future__ import annotations

import sqlite3
import time

import sqlalchemy as sa

from tests.cli.helpers import invoke, one_line_error
from zerda_store import Store, migrate
from zerda_store.db.migration import contract
from zerda_store.db.store import core_of
from zerda_store.errors import ReadOnlyStoreError


def test_db_contract_waits_a_bounded_time_for_another_writer_and_says_so(sqlite_url, monkeypatch):
    with Store(sqlite_url) as store:
        migrate.upgrade(store)
    monkeypatch.setattr(contract, "SQLITE_WAIT_MS", 500)
    writer = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        began = time.monotonic()
        line = one_line_error(invoke(sqlite_url, "db", "contract"))
        waited = time.monotonic() - began
    finally:
        writer.execute("ROLLBACK")
        writer.close()

    assert "db contract waited 0.5 s for another writer of" in line
    assert "nothing was changed" in line
    assert waited < 30


def test_a_sqlite_file_db_contract_cannot_write_is_named_as_such(sqlite_url):
    with Store(sqlite_url) as store:
        error = sa.exc.OperationalError(
            "BEGIN IMMEDIATE", {}, sqlite3.OperationalError("attempt to write a readonly database")
        )
        refusal = contract._sqlite_refusal(core_of(store), error)

    assert isinstance(refusal, ReadOnlyStoreError)
    assert "cannot be written (a read-only file or folder)" in str(refusal)
