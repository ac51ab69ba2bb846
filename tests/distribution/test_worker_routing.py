"""A store that routes its calls to the workers (``route_to_workers=True``, :mod:`db.placements`)
sends each save's and each recall's call straight to the worker that holds the session's
shards; the coordinator sees only the save's ids read. A placement gone stale (the shards
moved) or a worker out of reach costs the call a hop through the coordinator, never a lost
or wrong write (runs under ``scripts/test-citus`` only)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.citus import Cluster
from tests.distribution.test_erasure_after_a_move import move_session
from tests.distribution.test_fast_path import DELEGATED, ROUTER_PLAN, Planning
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db import placements as placements_module
from zerda_store.db.store import core_of

pytestmark = pytest.mark.citus

NAMES = ("Sarah Chen", "Acme Corp", "Berlin")
SESSION = "acme"  # as test_erasure_after_a_move's move_session names it
SAME_NODE = "not pushing down function to the same node"


@pytest.fixture
def url(citus_cluster: Cluster) -> Iterator[str]:
    found, drop = citus_cluster.new_database(distributed=True)
    yield found
    drop()


def _routed(url: str) -> str:
    return (
        sa.make_url(url)
        .update_query_dict({"route_to_workers": "true"})
        .render_as_string(hide_password=False)
    )


def _memory(store: Store) -> ConversationEntityMemory:
    return ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id=SESSION, store=store)


def _worker_planning(store: Store) -> tuple[tuple[str, int], Planning]:
    """The session's worker, and the planner messages of the store's connections there."""
    placements = core_of(store).placements
    assert placements is not None
    address = placements.node_of(SESSION)
    assert address is not None
    worker = placements.worker(address)
    return address, Planning(worker)  # type: ignore[arg-type]


def _calls(taken: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    return [
        (statement, messages)
        for statement, messages in taken
        if "zerda_save_turn_v1(" in statement or "zerda_recall_v1(" in statement
    ]


def test_a_save_and_a_recall_go_to_the_sessions_worker_not_the_coordinator(
    url: str, citus_cluster: Cluster
) -> None:
    with Store(_routed(url)) as store:
        coordinator = Planning(store)  # before any connection is opened
        address, worker = _worker_planning(store)
        assert address in citus_cluster.workers_at
        memory = _memory(store)
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
        coordinator.taken()
        worker.taken()
        memory.save_context({"input": "Sarah Chen in Berlin"}, {"output": "Noted"})
        recalled = memory.load_memory_variables({"input": "Sarah Chen and Berlin?"})
        memory.close()
    assert "Sarah Chen in Berlin" in recalled[memory.memory_key]
    at_coordinator = coordinator.taken()
    assert any("nextval(" in statement for statement, _ in at_coordinator)  # the save's ids
    assert _calls(at_coordinator) == []
    calls = _calls(worker.taken())
    assert [("zerda_save_turn_v1(" in s, "zerda_recall_v1(" in s) for s, _ in calls] == [
        (True, False),
        (False, True),
    ]
    for statement, messages in calls:  # run there: Citus did not look them up to send on
        assert statement.rstrip().endswith("WHERE pg_backend_pid() IS NOT NULL")
        assert not any(SAME_NODE in m or DELEGATED in m for m in messages)


def test_async_calls_go_to_the_sessions_worker(url: str) -> None:
    async def run() -> tuple[str, list[tuple[str, list[str]]]]:
        async with Store(_routed(url)) as store:
            memory = _memory(store)
            await memory.asave_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hi"})
            _address, worker = _worker_planning(store)
            await memory.asave_context({"input": "Sarah Chen in Berlin"}, {"output": "Noted"})
            recalled = await memory.aload_memory_variables({"input": "Sarah Chen and Berlin?"})
            await memory.aclose()
            return recalled[memory.memory_key], worker.taken()

    text, taken = asyncio.run(run())
    assert "Sarah Chen in Berlin" in text
    calls = _calls(taken)
    assert any("zerda_save_turn_v1(" in statement for statement, _ in calls)
    assert any("zerda_recall_v1(" in statement for statement, _ in calls)


def test_a_call_sent_to_a_worker_the_shards_left_reaches_them(
    url: str, citus_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The placements are read, then the session's shards move, and the store keeps its
    read: the recall, sent to the worker that held them, reads through the distributed
    tables (one statement Citus routes to where they are now); the save, sent there, writes
    nothing and is saved through the coordinator. The move's copy left behind is neither
    read nor written. Once the placements are read again, the calls go to the new worker."""
    monkeypatch.setattr(placements_module, "REFRESH_SECONDS", 3600.0)
    monkeypatch.setattr(placements_module, "REREAD_AFTER_SECONDS", 3600.0)
    with Store(_routed(url)) as store:
        coordinator = Planning(store)  # before any connection is opened
        source, held = _worker_planning(store)
        memory = _memory(store)
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
        placements = core_of(store).placements
        assert placements is not None
        coordinator.taken()
        held.taken()
        moved_from, target = move_session(url, citus_cluster)
        assert moved_from == source
        assert placements.known(SESSION) == (True, source)  # not read again
        first = memory.load_memory_variables({"input": "Sarah Chen?"})
        memory.save_context({"input": "Sarah Chen in Berlin"}, {"output": "Moved"})
        recalled = memory.load_memory_variables({"input": "Sarah Chen and Berlin?"})
        at_source, at_coordinator = _calls(held.taken()), coordinator.taken()
        monkeypatch.setattr(placements_module, "REREAD_AFTER_SECONDS", 0.0)
        placements.stale()
        assert placements.node_of(SESSION) == target
        memory.save_context({"input": "Acme Corp in Berlin"}, {"output": "There"})
        recalled_again = memory.load_memory_variables({"input": "Acme Corp?"})
        memory.close()
    assert "Sarah Chen of Acme Corp" in first[memory.memory_key]
    assert "Sarah Chen in Berlin" in recalled[memory.memory_key]
    assert "Acme Corp in Berlin" in recalled_again[memory.memory_key]
    kinds = [("zerda_save_turn_v1(" in s, "zerda_recall_v1(" in s) for s, _ in at_source]
    assert kinds == [(False, True), (True, False), (False, True)]
    for statement, messages in at_source:
        if "zerda_recall_v1(" in statement:  # through the distributed tables
            assert sum(message == ROUTER_PLAN for message in messages) == 1
    assert any(s.startswith("INSERT INTO turns") for s, _ in at_coordinator)  # the unit of work
    with sa.create_engine(url).connect() as connection:
        inputs = connection.execute(
            sa.text("SELECT input_text FROM turns WHERE session_id = :s ORDER BY id"),
            {"s": SESSION},
        ).scalars()
        assert list(inputs) == [
            "Sarah Chen of Acme Corp",
            "Sarah Chen in Berlin",
            "Acme Corp in Berlin",
        ]
        shard = connection.execute(
            sa.text("SELECT get_shard_id_for_distribution_column('turns', CAST(:s AS text))"),
            {"s": SESSION},
        ).scalar()
    old = sa.make_url(url).set(host=source[0], port=source[1])
    with sa.create_engine(old).connect() as connection:
        left = connection.execute(
            sa.text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"turns_{shard}"}
        ).scalar()
        if left:  # the move's copy, until Citus drops it: nothing written to it since
            count = connection.execute(sa.text(f"SELECT count(*) FROM turns_{shard}")).scalar()
            assert count == 1


def test_a_worker_out_of_reach_is_passed_over_for_the_coordinator(
    url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens where the workers are said to be: every call goes through the
    coordinator, once the worker is found out of reach, and nothing is lost."""
    reachable = placements_module.worker_url
    monkeypatch.setattr(
        placements_module, "worker_url", lambda u, a: reachable(u, ("127.0.0.1", 1))
    )
    with caplog.at_level(logging.WARNING, "zerda_store.engine"), Store(_routed(url)) as store:
        memory = _memory(store)
        for n in range(3):
            memory.save_context({"input": f"Sarah Chen of Acme Corp {n}"}, {"output": "Hi"})
        recalled = memory.load_memory_variables({"input": "Sarah Chen?"})
        memory.close()
        placements = core_of(store).placements
        assert placements is not None
        assert placements.known(SESSION) == (True, None)  # passed over
    assert "Sarah Chen of Acme Corp 2" in recalled[memory.memory_key]
    warnings = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
    assert len(warnings) == 1
    assert "127.0.0.1:1" in warnings[0]
