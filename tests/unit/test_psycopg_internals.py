"""psycopg's private names that the event loop's reads and writes drive
(:mod:`zerda_store.db.aio.psycopg_internals`): each is still there, called as it is called
there, and does what the adapter relies on. A psycopg that changes one fails here, by name,
before the loop path quietly sends everything to threads or breaks.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from zerda_store import Store
from zerda_store.db.aio.psycopg_internals import (
    PIPELINE_METHODS,
    LoopPipeline,
    execute,
    executes_on_loop,
    pipelines_on_loop,
)

psycopg = pytest.importorskip("psycopg")


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any]]:
    """Each parameter's name and kind (positional or keyword-only)."""
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
KEYWORD = inspect.Parameter.KEYWORD_ONLY


def test_the_installed_psycopg_has_everything_the_loop_drives() -> None:
    assert executes_on_loop()
    assert pipelines_on_loop()


def test_a_cursor_sends_a_statement_through_an_execution_generator() -> None:
    execute_gen = psycopg.Cursor._execute_gen
    assert inspect.isgeneratorfunction(execute_gen)
    assert _parameters(execute_gen)[:3] == [
        ("self", POSITIONAL),
        ("query", POSITIONAL),
        ("params", POSITIONAL),
    ]


def test_a_pipeline_can_be_made_without_the_connections_lock() -> None:
    parameters = inspect.signature(psycopg.Pipeline).parameters
    assert list(parameters)[:2] == ["conn", "_no_lock"]
    assert parameters["_no_lock"].default is False


def test_a_pipeline_enters_sends_and_fetches_through_generators() -> None:
    pipeline = psycopg.Pipeline
    for name in ("_enter_gen", "_communicate_gen", "_fetch_gen"):
        assert inspect.isgeneratorfunction(getattr(pipeline, name)), name
    assert _parameters(pipeline._enter_gen) == [("self", POSITIONAL)]
    assert _parameters(pipeline._communicate_gen) == [("self", POSITIONAL)]
    assert _parameters(pipeline._fetch_gen) == [("self", POSITIONAL), ("flush", KEYWORD)]


def test_a_pipeline_queues_its_sync_and_exits_with_plain_calls() -> None:
    pipeline = psycopg.Pipeline
    assert not inspect.isgeneratorfunction(pipeline._enqueue_sync)
    assert not inspect.isgeneratorfunction(pipeline._exit)
    assert _parameters(pipeline._enqueue_sync) == [("self", POSITIONAL)]
    assert _parameters(pipeline._exit) == [("self", POSITIONAL), ("exc", POSITIONAL)]
    assert set(PIPELINE_METHODS) == {
        "_enter_gen",
        "_enqueue_sync",
        "_communicate_gen",
        "_fetch_gen",
        "_exit",
    }


def test_libpq_output_is_sent_by_a_generator_and_waited_for_on_a_socket() -> None:
    from psycopg import generators, waiting

    assert [name for name, _ in _parameters(generators.send)] == ["pgconn"]
    for wait in (waiting.wait, waiting.wait_async):
        names = [name for name, _ in _parameters(wait)]
        assert names[:3] == ["gen", "fileno", "interval"], wait
    assert inspect.iscoroutinefunction(waiting.wait_async)


# -- on a server ------------------------------------------------------------------------------


@pytest.fixture
def driver(postgres_url: str) -> Iterator[tuple[Store, Any]]:
    """A store over a database with a ``probe`` table, and one of its psycopg connections
    in autocommit (as the loop path sets it)."""
    store = Store(postgres_url)
    with store.connect() as connection:
        connection.execute(sa.text("CREATE TABLE probe (id int)"))
        connection.commit()
    pooled = store.engine.raw_connection()
    driver_connection = pooled.dbapi_connection
    driver_connection.autocommit = True
    try:
        yield store, driver_connection
    finally:
        pooled.invalidate()
        store.close()


def _probe_ids(store: Store) -> list[int]:
    with store.connect() as connection:
        return [row[0] for row in connection.execute(sa.text("SELECT id FROM probe ORDER BY id"))]


@pytest.mark.postgres
def test_a_connection_holds_its_pipeline_in_a_private_attribute(
    driver: tuple[Store, Any],
) -> None:
    _, driver_connection = driver
    assert driver_connection._pipeline is None
    with driver_connection.pipeline() as pipeline:
        assert driver_connection._pipeline is pipeline
    assert driver_connection._pipeline is None


@pytest.mark.postgres
def test_a_statement_executed_on_the_loop_leaves_its_rows_on_the_cursor(
    driver: tuple[Store, Any],
) -> None:
    _, driver_connection = driver
    cursor = driver_connection.cursor()

    asyncio.run(execute(driver_connection, cursor, "SELECT %s::int + 1", (41,)))

    assert cursor.fetchall() == [(42,)]


@pytest.mark.postgres
def test_a_loop_pipeline_commits_its_statements_at_the_sync(driver: tuple[Store, Any]) -> None:
    store, driver_connection = driver
    insert, count = driver_connection.cursor(), driver_connection.cursor()
    pipeline = LoopPipeline(driver_connection)
    assert driver_connection._pipeline is not None
    pipeline.enter()
    pipeline.queue(insert, "INSERT INTO probe VALUES (%s)", (1,))
    pipeline.queue(count, "SELECT count(*) FROM probe", None)
    pipeline.send_sync()

    asyncio.run(pipeline.answers())
    pipeline.close(None)

    assert count.fetchall() == [(1,)]
    assert driver_connection._pipeline is None
    assert _probe_ids(store) == [1]


@pytest.mark.postgres
def test_a_loop_pipeline_with_an_error_rolls_everything_back(driver: tuple[Store, Any]) -> None:
    store, driver_connection = driver
    insert, divide = driver_connection.cursor(), driver_connection.cursor()
    pipeline = LoopPipeline(driver_connection)
    pipeline.enter()
    pipeline.queue(insert, "INSERT INTO probe VALUES (%s)", (1,))

    # psycopg reads the answers already there whenever it sends: the error may come back
    # while the rest is being sent (about 1 in 200 here), else with the answers.
    with pytest.raises(psycopg.errors.DivisionByZero) as raised:
        pipeline.queue(divide, "SELECT 1 / 0", None)
        pipeline.send_sync()
        asyncio.run(pipeline.answers())
    pipeline.close(raised.value)

    assert driver_connection._pipeline is None
    assert _probe_ids(store) == []
