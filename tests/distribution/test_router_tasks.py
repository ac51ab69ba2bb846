"""Each statement of the memory's hot path runs as one task on the session's shard, with no
intermediate result (runs under ``scripts/test-citus`` only). The coordinator reports every
command it sends to a worker (``citus.log_remote_commands``): a statement Citus must plan
in parts (a data-modifying CTE, an INSERT ... SELECT it pulls to the coordinator) ships its
parts' results back and forth with ``COPY`` and ``read_intermediate_result``, several hops
per statement; a routed statement is one command."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from tests.citus import Cluster
from tests.doubles import KeywordLLM
from zerda_store import AdminRepository, ConversationEntityMemory, Store

pytestmark = pytest.mark.citus

NAMES = ("Sarah Chen", "Acme Corp", "Berlin", "Omar Haddad", "Globex")
MANY = tuple(f"Client{n} Group" for n in range(12))
PLANNED_IN_PARTS = ("read_intermediate_result", "COPY ", "worker_partition_query_result")


@pytest.fixture
def url(citus_cluster: Cluster) -> Iterator[str]:
    found, drop = citus_cluster.new_database(distributed=True)
    yield found
    drop()


class RemoteCommands:
    """The commands the coordinator sent to workers on the store's connections."""

    def __init__(self, store: Store) -> None:
        self.sent: list[str] = []
        sa.event.listen(store.engine, "connect", self._listen)

    def _listen(self, dbapi_connection: psycopg.Connection, _record: object) -> None:
        dbapi_connection.add_notice_handler(self._notice)
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET citus.log_remote_commands = on")
        dbapi_connection.commit()

    def _notice(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        if (diagnostic.message_primary or "").startswith("issuing "):
            self.sent.append(diagnostic.message_primary or "")

    def taken(self) -> list[str]:
        taken, self.sent = self.sent, []
        return taken


def queries(commands: list[str]) -> list[str]:
    """The commands that ran a statement (not the transaction's own BEGIN, COMMIT, ...)."""
    control = ("issuing BEGIN", "issuing COMMIT", "issuing PREPARE TRANSACTION",
               "issuing COMMIT PREPARED", "issuing SELECT assign_distributed_transaction_id",
               "issuing ROLLBACK")  # fmt: skip
    return [c for c in commands if not c.startswith(control)]


def test_saves_and_recalls_send_one_command_per_statement(url: str) -> None:
    with Store(url) as store:
        commands = RemoteCommands(store)
        memory = ConversationEntityMemory(
            llm=KeywordLLM((*NAMES, *MANY)), session_id="acme", store=store
        )
        memory.save_context({"input": "Sarah Chen of Acme Corp"}, {"output": "Hello"})
        memory.save_context({"input": "Sarah Chen in Berlin"}, {"output": "Noted"})
        memory.save_context({"input": "Omar Haddad"}, {"output": "ok"}, idempotency_key="k")
        memory.save_context({"input": " and ".join(MANY)}, {"output": "a long list"})
        exact = ConversationEntityMemory(
            llm=KeywordLLM(MANY), session_id="exact", store=store, normalize_names=False
        )
        exact.save_context({"input": " and ".join(MANY)}, {"output": "a long list"})
        exact.close()
        saved = commands.taken()
        recalled = memory.load_memory_variables({"input": "Sarah Chen and Berlin?"})
        recall = commands.taken()
        memory.close()

    assert "Sarah Chen" in recalled[memory.memory_key]
    assert saved and recall
    for command in saved + recall:
        assert not any(part in command for part in PLANNED_IN_PARTS), command
    assert len(queries(recall)) == 1  # the recall: one statement, one command


def test_an_import_of_many_rows_sends_no_intermediate_result(url: str) -> None:
    with Store(url) as source:
        with ConversationEntityMemory(
            llm=KeywordLLM(MANY), session_id="acme", store=source
        ) as memory:
            memory.save_context({"input": " and ".join(MANY)}, {"output": "a long list"})
        records = list(AdminRepository(source).export_session("acme"))
    with Store(url) as store:  # a new process's store: no save has run in it
        commands = RemoteCommands(store)
        counts = AdminRepository(store).import_session("copy", records)
        sent = commands.taken()
    assert counts["entities"] == len(MANY)
    assert sent
    for command in sent:
        assert not any(part in command for part in PLANNED_IN_PARTS), command
