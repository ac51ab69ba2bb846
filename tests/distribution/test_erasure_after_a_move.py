"""Erasure on a cluster whose shards moved (runs under ``scripts/test-citus`` only): a
session's shard group moves to the other worker (as a rebalance moves it, by logical
replication), then ``forget_entity`` and ``prune`` erase on the new placement, and once
the copies the move left behind are cleaned up (``citus_cleanup_orphaned_resources``) no
node holds the erased rows in any shard."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.citus import Cluster
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory

pytestmark = pytest.mark.citus

SESSION = "acme"
NAMES = ("Sarah Chen", "Acme Corp")
# What the erased rows hold, per table: a shard table's rows that match are erased data.
ERASED = {
    "entities": "name = 'Sarah Chen'",
    "turns": "input_text LIKE '%Sarah Chen%'",
    "contexts": "text LIKE '%Sarah Chen%'",
}


@pytest.fixture
def url(citus_cluster: Cluster) -> Iterator[str]:
    found, drop = citus_cluster.new_database(distributed=True)
    yield found
    drop()


def admin(url: str | sa.URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def move_session(url: str, cluster: Cluster) -> tuple[tuple[str, int], tuple[str, int]]:
    """Move the session's shard group to the other worker (logical replication, as the
    rebalancer's 'auto' mode does); the (source, target) addresses."""
    with admin(url).connect() as connection:
        shard = connection.execute(
            sa.text("SELECT get_shard_id_for_distribution_column('turns', CAST(:session AS text))"),
            {"session": SESSION},
        ).scalar()
        host, port = connection.execute(
            sa.text("SELECT nodename, nodeport FROM citus_shards WHERE shardid = :shard"),
            {"shard": shard},
        ).one()
        source = (str(host), int(port))
        [target] = [worker for worker in cluster.workers_at if worker != source]
        connection.execute(
            sa.text(
                "SELECT citus_move_shard_placement(:shard, :sh, :sp, :th, :tp, "
                "shard_transfer_mode => 'force_logical')"
            ),
            {"shard": shard, "sh": source[0], "sp": source[1], "th": target[0], "tp": target[1]},
        )
        assert (
            connection.execute(
                sa.text("SELECT nodeport FROM citus_shards WHERE shardid = :shard"),
                {"shard": shard},
            ).scalar()
            == target[1]
        )
    return source, target


def erased_rows_on(url: str, host: str, port: int) -> dict[str, int]:
    """Rows of the erased entity in every shard of the tables on one worker, by table."""
    found: dict[str, int] = {}
    node = sa.make_url(url).set(host=host, port=port)
    with admin(node).connect() as connection:
        for table, condition in ERASED.items():
            shards = connection.execute(
                sa.text("SELECT relname FROM pg_class WHERE relkind = 'r' AND relname ~ :pattern"),
                {"pattern": f"^{table}_[0-9]+$"},
            ).scalars()
            found[table] = sum(
                connection.exec_driver_sql(
                    f'SELECT count(*) FROM "{shard}" WHERE {condition}'
                ).scalar()
                or 0
                for shard in shards
            )
    return found


@pytest.mark.fans_out  # the check of every shard on each worker, not the store's statements
def test_forget_and_prune_after_a_move_leave_no_copy_on_either_worker(
    url: str, citus_cluster: Cluster
) -> None:
    with ConversationEntityMemory(
        llm=KeywordLLM(NAMES), session_id=SESSION, database_url=url
    ) as memory:
        for call in range(5):
            memory.save_context(
                {"input": f"Sarah Chen of Acme Corp, call {call}"}, {"output": "noted"}
            )
        source, target = move_session(url, citus_cluster)
        memory.set_retention(keep_last=2)
        pruned = memory.prune()
        forgotten = memory.forget_entity("Sarah Chen", with_turns=True)
        assert memory.get_entity_info("Sarah Chen") is None
        assert memory.get_memory_stats()["message_count"] == 0
    assert pruned["snippets"] == 2 * 3  # two entities, five snippets each, two kept
    assert forgotten
    with admin(url).connect() as connection:
        connection.exec_driver_sql("CALL citus_cleanup_orphaned_resources()")
        assert connection.exec_driver_sql("SELECT count(*) FROM pg_dist_cleanup").scalar() == 0
    nothing = dict.fromkeys(ERASED, 0)
    assert erased_rows_on(url, *target) == nothing
    assert erased_rows_on(url, *source) == nothing
