"""`zerda-store db citus` outside Citus: refused in one line, changing nothing (the commands
on a cluster: tests/distribution/test_citus_nodes.py and scripts/citus-elastic)."""

from __future__ import annotations

import pytest

from tests.cli.helpers import invoke, one_line_error
from zerda_store import Store, migrate


@pytest.mark.parametrize(
    "command", [("nodes",), ("rebalance",), ("drain", "h:5432"), ("add-worker", "h:5432")]
)
def test_db_citus_on_sqlite_is_refused_in_one_line(
    sqlite_url: str, command: tuple[str, ...]
) -> None:
    with Store(sqlite_url) as store:
        migrate.upgrade(store)
    line = one_line_error(invoke(sqlite_url, "db", "citus", *command))
    assert "is not a Citus coordinator" in line


@pytest.mark.postgres
def test_db_citus_on_plain_postgres_is_refused_in_one_line(postgres_url: str) -> None:
    line = one_line_error(invoke(postgres_url, "db", "citus", "nodes"))
    assert "is not a Citus coordinator (no citus extension)" in line
