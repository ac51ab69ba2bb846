"""`db distribute` and `db upgrade` on a real Citus cluster (runs under ``scripts/test-citus``
only): the tables end up distributed by session and co-located, a second run leaves them
as they are and says so, and a later revision upgrades a distributed database."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.citus import Cluster
from tests.cli.helpers import invoke, one_line_error, succeeded
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store, migrate
from zerda_store.db.citus import distribution
from zerda_store.db.citus.distribution import DISTRIBUTED_TABLES, REFERENCE_TABLES

pytestmark = pytest.mark.citus

EVERY_TABLE = (*REFERENCE_TABLES, *DISTRIBUTED_TABLES)
FUNCTIONS = (
    "zerda_shard_lock_v1",
    "zerda_save_turn_v1",
    "zerda_recall_v1",
    "zerda_session_lock_v1",
)


@pytest.fixture
def empty_citus_url(citus_cluster: Cluster) -> Iterator[str]:
    """A database with the citus extension and the cluster's nodes, and no tables."""
    url, drop = citus_cluster.new_database(distributed=False)
    yield url
    drop()


def citus_layout(url: str) -> dict[str, tuple[str, str | None, int]]:
    """Each table as Citus's catalog has it: its type, distribution column, colocation."""
    with Store(url) as store, store.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT table_name::text, citus_table_type, distribution_column, colocation_id "
                "FROM citus_tables"
            )
        ).all()
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


def test_distribute_spreads_every_table_by_session_on_one_colocation(
    empty_citus_url: str,
) -> None:
    assert succeeded(invoke(empty_citus_url, "db", "upgrade"))
    output = succeeded(invoke(empty_citus_url, "db", "distribute")).stdout
    assert output.splitlines()[-1] == "tables distributed by session_id"
    layout = citus_layout(empty_citus_url)
    assert set(layout) == set(EVERY_TABLE)
    assert layout["retention_policies"][0] == "reference"
    by_session = {layout[table][:2] for table in DISTRIBUTED_TABLES}
    assert by_session == {("distributed", "session_id")}
    assert len({layout[table][2] for table in DISTRIBUTED_TABLES}) == 1


def test_a_second_distribute_says_what_is_distributed_and_changes_nothing(
    empty_citus_url: str,
) -> None:
    with Store(empty_citus_url) as store:
        migrate.upgrade(store)
        distribution.distribute(store)
    before = citus_layout(empty_citus_url)
    dry = succeeded(invoke(empty_citus_url, "db", "distribute", "--dry-run")).stdout
    assert dry.splitlines() == [
        *(f"-- already distributed: {table}" for table in EVERY_TABLE),
        *(f"-- CREATE OR REPLACE FUNCTION public.{name}( ..." for name in FUNCTIONS),
        *(line for line in dry.splitlines() if "create_distributed_function" in line),
    ]
    distributing = [line for line in dry.splitlines() if "create_distributed_function" in line]
    assert len(distributing) == len(FUNCTIONS)
    again = succeeded(invoke(empty_citus_url, "db", "distribute")).stdout.splitlines()
    assert again == [
        *(f"already distributed: {table}" for table in EVERY_TABLE),
        *(f"created and distributed: public.{name}" for name in FUNCTIONS),
        "every table is distributed already: the functions were created again",
    ]
    answer = json.loads(succeeded(invoke(empty_citus_url, "db", "distribute", "--json")).stdout)
    assert answer == {
        "dry_run": False,
        "ran": True,  # the functions, created again
        "statements": [],
        "already_distributed": list(EVERY_TABLE),
        "functions": [f"public.{name}" for name in FUNCTIONS],
        "blockers": [],
    }
    assert citus_layout(empty_citus_url) == before


def test_a_half_distributed_database_gets_the_rest(empty_citus_url: str) -> None:
    with Store(empty_citus_url) as store:
        migrate.upgrade(store)
        with store.connect() as connection, connection.begin():
            for statement in distribution.statements()[:3]:
                connection.exec_driver_sql(statement)
    output = succeeded(invoke(empty_citus_url, "db", "distribute")).stdout.splitlines()
    assert output[:3] == [f"already distributed: {table}" for table in EVERY_TABLE[:3]]
    assert len([line for line in output if line.startswith("ran: ")]) == len(EVERY_TABLE) - 3
    assert set(citus_layout(empty_citus_url)) == set(EVERY_TABLE)


def test_a_table_distributed_by_another_column_blocks_the_run(empty_citus_url: str) -> None:
    with Store(empty_citus_url) as store:
        migrate.upgrade(store)
        with store.connect() as connection, connection.begin():
            connection.exec_driver_sql("SELECT create_reference_table('session_key_rules')")
    result = invoke(empty_citus_url, "db", "distribute")
    assert result.exit_code != 0
    assert "session_key_rules is distributed reference already, not by session_id" in (
        result.output
    )
    assert citus_layout(empty_citus_url).keys() == {"session_key_rules"}


def test_a_distributed_database_with_rows_goes_down_and_up_a_revision(
    empty_citus_url: str,
) -> None:
    """A schema change after distribution, as the documentation gives it: `db upgrade` (or
    `db downgrade`) on the coordinator; Citus carries each statement to the shards."""
    with Store(empty_citus_url) as store:
        migrate.upgrade(store)
        distribution.distribute(store)
    llm = KeywordLLM(("Sarah Chen", "Acme Corp"))
    with ConversationEntityMemory(llm=llm, session_id="acme", database_url=empty_citus_url) as m:
        m.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
    earlier = "0007"  # the revision before the views by session (0008)
    succeeded(invoke(empty_citus_url, "db", "downgrade", earlier, "--yes"))
    assert succeeded(invoke(empty_citus_url, "db", "current")).stdout.startswith(earlier)
    output = succeeded(invoke(empty_citus_url, "db", "upgrade")).stdout
    assert output.strip().splitlines()[-1] == f"database at revision {migrate.head_revision()}"
    with ConversationEntityMemory(llm=llm, session_id="acme", database_url=empty_citus_url) as m:
        m.save_context({"input": "Sarah Chen again"}, {"output": "Hi"})
        assert m.get_memory_stats()["message_count"] == 2
    with Store(empty_citus_url) as store, store.connect() as connection:
        count = connection.execute(
            sa.text(
                "SELECT contexts_count FROM entity_overview "
                "WHERE session_id = 'acme' AND name = 'Sarah Chen'"
            )
        ).scalar()
    assert count == 2
    assert citus_layout(empty_citus_url).keys() == set(EVERY_TABLE)


def test_a_downgrade_below_the_keys_by_session_is_refused_and_changes_nothing(
    empty_citus_url: str,
) -> None:
    """Below revision 0007 the primary keys lack session_id, which Citus refuses on
    distributed tables: the downgrade fails in one line and the schema stays at head."""
    with Store(empty_citus_url) as store:
        migrate.upgrade(store)
        distribution.distribute(store)
    line = one_line_error(invoke(empty_citus_url, "db", "downgrade", "0006", "--yes"))
    assert "cannot create constraint" in line
    current = succeeded(invoke(empty_citus_url, "db", "current")).stdout
    assert current.strip() == f"{migrate.head_revision()} (head)"
    assert citus_layout(empty_citus_url).keys() == set(EVERY_TABLE)
