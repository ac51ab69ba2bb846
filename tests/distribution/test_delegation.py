"""The save and the recall run as functions on the session's worker (runs under
``scripts/test-citus`` only): they write and read what the routed unit of work writes and
reads, names that need resolving still resolve, and the session's lock excludes a
delegated save as it excludes any save (``turns.delegated``)."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.citus import SAVE_CALL, Cluster
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.sharding import Sharding, distributed
from zerda_store.db.store import core_of

pytestmark = pytest.mark.citus

NAMES = ("Dr. Sarah Chen", "Sarah Chen", "Acme Corp", "Acme", "Berlin", "Bob", "Carol Diaz")
CONVERSATION = (
    "Sarah Chen of Acme Corp called about the renewal",
    "Bob and Carol Diaz met Sarah Chen in Berlin",
    "Dr. Sarah Chen asked for the Acme contract",  # a titled form: resolved by the unit of work
    "Acme wants a discount",  # a bare core of Acme Corp: resolved too
    "Carol Diaz and Bob again",
    "Berlin office of Acme Corp",
    "Sarah Chen and Bob",
)
QUESTIONS = ("What about Sarah Chen?", "Acme Corp and Berlin?", "Dr. Sarah Chen", "Carol Diaz")


@pytest.fixture
def url(citus_cluster: Cluster) -> Iterator[str]:
    found, drop = citus_cluster.new_database(distributed=True)
    yield found
    drop()


def talk(store: Store, session_id: str) -> list[Any]:
    """The conversation saved in ``session_id``, an alias added midway, the answers to the
    questions and the session's entities."""
    memory = ConversationEntityMemory(
        llm=KeywordLLM(NAMES),
        session_id=session_id,
        store=store,
        clock=itertools.count(1000.0, 100.0).__next__,
    )
    for number, text in enumerate(CONVERSATION):
        memory.save_context({"input": text}, {"output": "noted"}, idempotency_key=f"t{number}")
        if number == 1:
            memory.add_alias("Bob", "Robert")
    memory.save_context({"input": CONVERSATION[0]}, {"output": "again"}, idempotency_key="t0")
    answers = [memory.load_memory_variables({"input": q})[memory.memory_key] for q in QUESTIONS]
    listed = memory.list_entities()
    memory.close()
    return [answers, listed]


def session_rows(url: str, session_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """What the session holds, by content (ids read as the turns' order)."""
    reads = {
        "turns": "SELECT input_text, output_text, entity_names::text, created_at, "
        "idempotency_key FROM turns WHERE session_id = :s ORDER BY id",
        "entities": "SELECT e.name_key, e.core_key, e.name, e.entity_type, e.first_seen, "
        "e.last_seen, (SELECT count(*) FROM turns t WHERE t.session_id = e.session_id "
        "AND t.id <= e.first_turn_id), e.first_position FROM entities e "
        "WHERE e.session_id = :s ORDER BY e.name_key",
        "contexts": "SELECT e.name_key, c.text, c.created_at FROM contexts c JOIN entities e "
        "ON e.session_id = c.session_id AND e.id = c.entity_id WHERE c.session_id = :s "
        "ORDER BY c.turn_seq, e.name_key",
        "extractions": "SELECT extractor, status, error, entity_count, attempts, updated_at "
        "FROM extractions x JOIN turns t ON t.session_id = x.session_id AND t.id = x.turn_id "
        "WHERE x.session_id = :s ORDER BY t.id",
        "aliases": "SELECT e.name_key, a.alias, a.alias_key, a.core_key, a.source "
        "FROM entity_aliases a JOIN entities e ON e.session_id = a.session_id "
        "AND e.id = a.entity_id WHERE a.session_id = :s ORDER BY a.alias_key",
    }
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                table: [tuple(row) for row in connection.execute(sa.text(sql), {"s": session_id})]
                for table, sql in reads.items()
            }
    finally:
        engine.dispose()


def test_the_delegated_save_and_recall_match_the_routed_ones(url: str) -> None:
    with Store(url) as delegating, Store(url) as routing:
        assert distributed(core_of(delegating))
        assert core_of(delegating).statements(Sharding).delegated
        assert distributed(core_of(routing))
        core_of(routing).statements(Sharding).delegated = False  # as before db distribute
        by_delegation = talk(delegating, "delegated")
        by_routes = talk(routing, "routed")

    assert by_delegation == by_routes
    assert "Sarah Chen" in by_delegation[0][0]
    assert session_rows(url, "delegated") == session_rows(url, "routed")


def held_back(engine: sa.Engine, lock: sa.TextClause, call: Callable[[], object]) -> None:
    """``call``, run in a thread while a connection of ``engine`` holds ``lock``, does not
    return before the lock is released, and returns once it is."""
    done = threading.Event()

    def run() -> None:
        call()
        done.set()

    with engine.connect() as holder:
        holder.execute(lock)
        caller = threading.Thread(target=run)
        caller.start()
        waited = done.wait(1.0)
        holder.rollback()
    caller.join(10)
    assert not waited, "it ran while the lock was held"
    assert done.is_set()


def test_an_exclusive_lock_waits_for_a_delegated_save_and_a_save_for_it(url: str) -> None:
    """The session's lock held exclusively on its worker (as erasure, clear and import take
    it) holds a delegated save back until it is released; a save that holds it shared holds
    an exclusive writer (here ``clear``) back."""
    with Store(url) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id="s", store=store)
        memory.save_context({"input": "Sarah Chen"}, {"output": "hi"})  # records the rules
        assert core_of(store).statements(Sharding).delegated
        engine = sa.create_engine(url)
        try:
            held_back(
                engine,
                sa.text("SELECT zerda_session_lock_v1('s', true, 5000)"),
                lambda: memory.save_context({"input": "Sarah Chen of Acme"}, {"output": "ok"}),
            )
            held_back(
                engine, sa.text("SELECT zerda_session_lock_v1('s', false, 5000)"), memory.clear
            )
        finally:
            engine.dispose()
            memory.close()


def test_a_database_distributed_before_the_functions_saves_by_the_routed_unit(url: str) -> None:
    """Without the functions (a database distributed by an earlier release, ``db
    distribute`` not run again), saves and recalls take the routed statements."""
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("DROP FUNCTION zerda_save_turn_v1"))
    engine.dispose()
    with Store(url) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id="s", store=store)
        for text in CONVERSATION[:3]:
            memory.save_context({"input": text}, {"output": "ok"})
        assert not core_of(store).statements(Sharding).delegated
        answer = memory.load_memory_variables({"input": "Sarah Chen?"})[memory.memory_key]
        memory.close()
    assert "Sarah Chen" in answer


def test_a_shard_move_switching_placements_holds_a_delegated_save_back(url: str) -> None:
    """While a move or a split switches the session's shard group to new placements, it
    holds the group's metadata lock exclusively on every node (``lock_shard_metadata(7,
    ...)``, as Citus takes it): a delegated save, which writes the shards themselves on the
    worker under the lock Citus's writes take, waits until it is released, then saves."""
    with Store(url) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id="s", store=store)
        memory.save_context({"input": "Sarah Chen"}, {"output": "hi"})  # records the rules
        with store.connect() as connection:
            shard, port = connection.execute(
                sa.text(
                    "SELECT shardid, nodeport FROM citus_shards WHERE shardid = "
                    "get_shard_id_for_distribution_column('turns', 's')"
                )
            ).one()
        mover = sa.create_engine(sa.make_url(url).set(port=port))
        lock = sa.text(f"SELECT lock_shard_metadata(7, ARRAY[{int(shard)}]::bigint[])")
        try:
            held_back(
                mover,
                lock,
                lambda: memory.save_context({"input": "Sarah Chen again"}, {"output": "ok"}),
            )
            answer = memory.load_memory_variables({"input": "Sarah Chen?"})[memory.memory_key]
        finally:
            mover.dispose()
            memory.close()
    assert "Sarah Chen again" in answer


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_a_save_that_waited_for_a_move_of_its_shards_is_saved_where_they_went(
    url: str, isolation: str
) -> None:
    """A delegated save that reaches the session's worker while the session's shard group
    moves away (here it waits for the session's lock, held while the group moves) writes
    nothing in the shards left behind, and the routed unit of work saves it where the group
    went. Under repeatable read, where the function's reads would see the placement as it
    was before the wait, it leaves every save to the unit of work."""
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        shard, source, target = connection.execute(
            sa.text(
                "SELECT s.shardid, s.nodeport, (SELECT n.nodeport FROM pg_dist_node n "
                "WHERE n.groupid > 0 AND n.nodeport <> s.nodeport LIMIT 1) "
                "FROM citus_shards s WHERE s.shardid = "
                "get_shard_id_for_distribution_column('turns', 's')"
            )
        ).one()
        host = sa.make_url(url).host
    left_behind = sa.create_engine(sa.make_url(url).set(port=source), isolation_level="AUTOCOMMIT")
    holding = sa.create_engine(url)
    try:
        with left_behind.connect() as connection:
            database = sa.make_url(url).database
            connection.execute(
                sa.text(
                    f"ALTER DATABASE \"{database}\" SET default_transaction_isolation = '{isolation}'"
                )
            )
        with Store(url) as store:
            memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), session_id="s", store=store)
            memory.save_context({"input": "Sarah Chen"}, {"output": "hi"})
            done = threading.Event()

            def save() -> None:
                memory.save_context({"input": "Sarah Chen of Acme"}, {"output": "ok"})
                done.set()

            with holding.connect() as holder, holder.begin():
                holder.execute(sa.text("SELECT zerda_session_lock_v1('s', true, 20000)"))
                saver = threading.Thread(target=save)
                saver.start()
                assert not done.wait(0.5)  # waiting on the session's worker
                with admin.connect() as mover:
                    mover.execute(
                        sa.text(
                            "SELECT citus_move_shard_placement(:shard, :host, :source, :host, "
                            ":target, shard_transfer_mode => 'block_writes')"
                        ),
                        {"shard": shard, "host": host, "source": source, "target": target},
                    )
            saver.join(30)
            assert done.is_set()
            answer = memory.load_memory_variables({"input": "Sarah Chen?"})[memory.memory_key]
            memory.close()
        with admin.connect() as connection:
            stored = connection.execute(
                sa.text("SELECT input_text FROM turns WHERE session_id = 's' ORDER BY id")
            ).scalars()
            assert list(stored) == ["Sarah Chen", "Sarah Chen of Acme"]
        assert "Sarah Chen of Acme" in answer
        with left_behind.connect() as connection:  # the old shard, until Citus drops it
            old = connection.execute(
                sa.text("SELECT to_regclass(:name)"), {"name": f"public.turns_{shard}"}
            ).scalar()
            if old is not None:
                count = connection.execute(
                    sa.text(f"SELECT count(*) FROM public.turns_{shard} WHERE session_id = 's'")
                ).scalar()
                assert count == 1
    finally:
        holding.dispose()
        left_behind.dispose()
        admin.dispose()


def test_a_role_that_does_not_own_the_tables_saves_and_recalls_through_the_functions(
    url: str,
) -> None:
    """The application's role (``db grant --service``: rows, not the schema) saves and
    recalls through the functions, on the shards themselves, the same rows as the owner."""
    role = f"zerda_user_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        for statement in (
            f"CREATE ROLE {role} LOGIN",
            f"GRANT USAGE ON SCHEMA public TO {role}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
            f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}",
        ):
            connection.execute(sa.text(statement))
    as_role = sa.make_url(url).set(username=role)
    try:
        with Store(as_role) as user, Store(url) as owner:
            assert distributed(core_of(user)) and core_of(user).statements(Sharding).delegated
            by_user = talk(user, "user")
            by_owner = talk(owner, "owner")
        assert by_user == by_owner
        assert session_rows(url, "user") == session_rows(url, "owner")
        called = sa.create_engine(as_role, isolation_level="AUTOCOMMIT")  # delegated
        try:
            with called.connect() as connection:
                answer = connection.execute(sa.text(SAVE_CALL.format(turn=9001))).all()
        finally:
            called.dispose()
        assert [tuple(row) for row in answer] == [(9001, False)]  # written by the function
    finally:
        with engine.connect() as connection:
            connection.execute(sa.text(f"DROP OWNED BY {role}"))
            connection.execute(sa.text(f"DROP ROLE {role}"))
        engine.dispose()
