"""A URL that names several Postgres servers, the first of which does not answer: the
driver moves on to the next, for the Python API and for the command line alike (the
failover harness, ``tests/failover``, shows the same with a real standby and promotion)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of, succeeded
from tests.doubles import NamesExtractor, new_postgres_database
from zerda_store import ConversationEntityMemory, Store, migrate
from zerda_store.db.store import core_of

pytestmark = pytest.mark.postgres


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again once the probe is


@pytest.fixture
def listed_url(postgres_admin: sa.Engine) -> Iterator[str]:
    """A fresh empty database, reached through a list whose first host refuses."""
    url, drop = new_postgres_database(postgres_admin)
    parsed = sa.make_url(url)
    user = f"{parsed.username}@" if parsed.username else ""
    listed = (
        f"postgresql://{user}127.0.0.1:{_closed_port()},{parsed.host}:{parsed.port or 5432}"
        f"/{parsed.database}?target_session_attrs=read-write"
    )
    yield listed
    drop()


def test_a_store_on_a_list_of_hosts_uses_the_one_that_answers(listed_url: str) -> None:
    with Store(listed_url) as store:
        migrate.upgrade(store)
        with core_of(store).query() as connection:
            writable = connection.exec_driver_sql("SHOW transaction_read_only").scalar()
        assert writable == "off"
    memory = ConversationEntityMemory(
        extractor=NamesExtractor(["Alice Harper"]), database_url=listed_url, session_id="s"
    )
    with memory:
        memory.save_context({"input": "Alice Harper renewed."}, {"output": "Noted."})
        memory.save_context({"input": "Again."}, {"output": "Ok."}, idempotency_key="k1")
        memory.save_context({"input": "Again."}, {"output": "Ok."}, idempotency_key="k1")
        assert len(memory.chat_memory) == 2
        recalled = memory.load_memory_variables({"input": "Alice Harper?"})["entity_info"]
        assert "Alice Harper renewed. Noted." in recalled


def test_the_command_line_upgrades_and_reads_through_a_list_of_hosts(listed_url: str) -> None:
    assert "database at revision" in succeeded(invoke(listed_url, "db", "upgrade")).stdout
    assert json_of(invoke(listed_url, "sessions", "--json")) == []
    assert "(head)" in succeeded(invoke(listed_url, "db", "current")).stdout
