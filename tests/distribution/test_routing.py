"""Routing on a real Citus cluster (runs under ``scripts/test-citus`` only): with
``citus.multi_task_query_log_level = error`` the coordinator refuses any statement that
would run on more than one shard, so every operation below that succeeds ran each of its
statements on the session's shard alone. The operations over every session are the
exceptions, and a test pins each one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.citus import Cluster
from tests.cli.helpers import invoke, succeeded
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store

pytestmark = pytest.mark.citus

NAMES = ("Sarah Chen", "Acme Corp", "Berlin", "Omar Haddad", "Globex", "Lee", "Ann")
# More new entities than a VALUES insert carries (the arrays form takes the rest).
MANY = tuple(f"Client{n} Group" for n in range(12))
MULTI_TASK = "multi-task query about to be executed"


@pytest.fixture
def strict_url(citus_cluster: Cluster) -> Iterator[str]:
    """A distributed database where a statement on more than one shard fails."""
    url, drop = citus_cluster.new_database(distributed=True)
    yield url
    drop()


def memory_on(url: str, session_id: str = "acme") -> ConversationEntityMemory:
    return ConversationEntityMemory(
        llm=KeywordLLM((*NAMES, *MANY)), session_id=session_id, database_url=url
    )


def test_the_strict_database_refuses_a_statement_over_every_shard(strict_url: str) -> None:
    with Store(strict_url) as store:
        with store.connect() as connection, pytest.raises(sa.exc.DBAPIError, match=MULTI_TASK):
            connection.execute(sa.text("SELECT count(*) FROM turns")).scalar()
        with store.connect() as connection:
            routed = connection.execute(
                sa.text("SELECT count(*) FROM turns WHERE session_id = 'acme'")
            ).scalar()
    assert routed == 0


def test_the_hot_path_runs_on_the_sessions_shard(strict_url: str) -> None:
    with memory_on(strict_url) as memory:
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello Sarah Chen"})
        memory.save_context(
            {"input": "Acme Corp moves to Berlin"}, {"output": "Noted"}, idempotency_key="k1"
        )
        memory.save_context(
            {"input": "Acme Corp moves to Berlin"}, {"output": "x"}, idempotency_key="k1"
        )
        saved = memory.save_contexts(
            [
                ({"input": " and ".join(MANY)}, {"output": "a long list"}),
                ({"input": "Lee"}, {"output": "ok"}),
            ]
        )
        recalled = memory.load_memory_variables({"input": "What about Sarah Chen and Berlin?"})
        info = memory.get_entity_info("Sarah Chen")
        store = memory.entity_store
        sarah = store["Sarah Chen"]
        sarah.add_context("Note: prefers email")
        noted = sarah.get_recent_contexts(limit=None)
        names, turns = list(store), list(memory.chat_memory)
        stats = memory.get_memory_stats()
    assert saved == 2
    assert "Sarah Chen" in recalled[memory.memory_key]
    assert info is not None and info["name"] == "Sarah Chen"
    assert "Note: prefers email" in noted
    assert {"Sarah Chen", "Acme Corp", "Berlin", *MANY} <= set(names)
    assert len(turns) == 4
    assert stats["message_count"] == 4


def test_the_async_twins_run_on_the_sessions_shard(strict_url: str) -> None:
    memory = memory_on(strict_url, "async")

    async def run() -> tuple[dict[str, object], dict[str, object] | None, dict[str, object]]:
        try:
            await memory.asave_context({"input": "Omar Haddad from Globex"}, {"output": "Hi"})
            recalled = await memory.aload_memory_variables({"input": "And Globex?"})
            info = await memory.aget_entity_info("Globex")
            stats = await memory.aget_memory_stats()
            await memory.alist_entities()
            await memory.aforget_entity("Omar Haddad")
            await memory.aclear()
        finally:
            await memory.aclose()
        return recalled, info, stats

    recalled, info, stats = asyncio.run(run())
    assert "Globex" in str(recalled[memory.memory_key])
    assert info is not None
    assert stats["message_count"] == 1


def test_the_operator_paths_of_one_session_run_on_its_shard(strict_url: str) -> None:
    with memory_on(strict_url) as memory:
        memory.save_context({"input": "Sarah Chen and Ann at Acme Corp"}, {"output": "ok"})
        memory.save_context({"input": "Ann in Berlin with Lee"}, {"output": "ok"})
        assert memory.add_alias("Sarah Chen", "Sarah")
        assert memory.aliases()
        merged = memory.merge_entities("Sarah Chen", "Ann")
        assert memory.merges()
        memory.unmerge(merged["merge_id"])
        assert memory.remove_alias("Sarah")
        memory.similar_entities()
        memory.set_retention(keep_last=1)
        assert memory.prune(dry_run=True)["snippets"] >= 1
        assert memory.prune()["snippets"] >= 1
        memory.set_retention(max_age=3600.0)
        memory.prune()
        memory.forget_entity("Berlin")
        memory.forget_entity("Lee", with_turns=True)
        memory.reextract()
        memory.clear()


def test_the_command_lines_of_one_session_run_on_its_shard(
    strict_url: str, citus_cluster: Cluster, tmp_path: Path
) -> None:
    with memory_on(strict_url) as memory:
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
    exported = tmp_path / "acme.jsonl"
    succeeded(invoke(strict_url, "export", "--session", "acme", "--output", str(exported)))
    succeeded(invoke(strict_url, "import", "--session", "copy", str(exported)))
    listed = succeeded(invoke(strict_url, "entities", "--session", "copy")).stdout
    assert "Sarah Chen" in listed
    succeeded(invoke(strict_url, "merges", "--session", "copy"))
    assert "1" in succeeded(invoke(strict_url, "stats", "--session", "copy")).stdout
    succeeded(invoke(strict_url, "entity", "--session", "copy", "Sarah Chen"))
    succeeded(invoke(strict_url, "prune", "--session", "copy", "--dry-run"))
    succeeded(invoke(strict_url, "forget", "--yes", "--session", "copy", "Sarah Chen"))
    other, drop = citus_cluster.new_database(distributed=True)
    try:
        succeeded(invoke(strict_url, "copy", "--to", other, "--session", "acme"))
        with memory_on(other) as copied:
            assert copied.get_entity_info("Sarah Chen") is not None
    finally:
        drop()


def test_the_views_read_for_one_session_run_on_its_shard(strict_url: str) -> None:
    with memory_on(strict_url) as memory:
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
        memory.save_context({"input": "Sarah Chen again"}, {"output": "Hi"})
    with Store(strict_url) as store, store.connect() as connection:
        overview = connection.execute(
            sa.text(
                "SELECT name, contexts_count, last_context FROM entity_overview "
                "WHERE session_id = 'acme' ORDER BY name"
            )
        ).all()
        snippets = connection.execute(
            sa.text(
                "SELECT name, recency, text FROM entity_snippets "
                "WHERE session_id = 'acme' ORDER BY name, recency"
            )
        ).all()
    assert [(row.name, row.contexts_count) for row in overview] == [
        ("Acme Corp", 1),
        ("Sarah Chen", 2),
    ]
    assert [(row.name, row.recency) for row in snippets] == [
        ("Acme Corp", 1),
        ("Sarah Chen", 1),
        ("Sarah Chen", 2),
    ]


def test_the_operations_over_every_session_use_every_shard(strict_url: str) -> None:
    with memory_on(strict_url) as memory:
        memory.save_context({"input": "Sarah Chen"}, {"output": "Hello"})
    # (A prune of every session reads the policies, a reference table, then prunes each
    # session that has one on its shard.)
    succeeded(invoke(strict_url, "prune", "--dry-run"))
    for command in (("sessions",), ("stats",)):
        result = invoke(strict_url, *command)
        assert result.exit_code != 0 and MULTI_TASK in result.output, command
