"""Least privilege on a real Citus cluster (runs under ``scripts/test-citus`` only): roles
made on the coordinator, `db grant` run there, and the service role saving, recalling and
erasing through the coordinator while it cannot change the schema; the inspector reads and
cannot write. Citus propagates the roles and the grants to the workers' shards."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from tests.citus import Cluster
from tests.cli.helpers import invoke, json_of, succeeded
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store

pytestmark = pytest.mark.citus


def test_a_service_role_granted_on_citus_works_and_cannot_change_the_schema(
    citus_cluster: Cluster,
) -> None:
    url, drop = citus_cluster.new_database(distributed=True)
    suffix = uuid.uuid4().hex[:8]
    service, inspector = f"zerda_service_{suffix}", f"zerda_inspector_{suffix}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"CREATE ROLE {service} LOGIN")
            connection.exec_driver_sql(f"CREATE ROLE {inspector} LOGIN")
        granted = json_of(
            succeeded(
                invoke(url, "db", "grant", "--service", service, "--inspector", inspector, "--json")
            )
        )
        assert granted

        as_service = sa.make_url(url).set(username=service).render_as_string(False)
        with ConversationEntityMemory(
            KeywordLLM(["Omar Haddad", "Riyadh"]), database_url=as_service, session_id="c-1"
        ) as memory:
            memory.save_context({"input": "Omar Haddad flies to Riyadh"}, {"output": "ok"})
            recalled = memory.load_memory_variables({"input": "Omar Haddad"})["entity_info"]
            assert "Omar Haddad flies to Riyadh" in recalled
            assert memory.forget_entity("Riyadh")
            assert memory.list_entities() == ["Omar Haddad"]
        service_engine = sa.create_engine(as_service, poolclass=sa.NullPool)
        with service_engine.connect() as connection, pytest.raises(sa.exc.ProgrammingError):
            connection.exec_driver_sql("CREATE TABLE intruder (id int)")
        service_engine.dispose()

        as_inspector = sa.make_url(url).set(username=inspector).render_as_string(False)
        inspector_engine = sa.create_engine(as_inspector, poolclass=sa.NullPool)
        with inspector_engine.connect() as connection:
            rows = connection.exec_driver_sql(
                "SELECT name FROM entity_overview WHERE session_id = 'c-1'"
            ).all()
            assert [row[0] for row in rows] == ["Omar Haddad"]
            with pytest.raises(sa.exc.ProgrammingError):
                connection.exec_driver_sql("DELETE FROM turns WHERE session_id = 'c-1'")
        inspector_engine.dispose()
        with Store(url) as store, store.connect() as connection:  # as it was, for the owner
            count = connection.exec_driver_sql(
                "SELECT count(*) FROM turns WHERE session_id = 'c-1'"
            ).scalar()
        assert count == 1
    finally:
        admin.dispose()
        drop()
        cleanup = sa.create_engine(
            citus_cluster.url.render_as_string(False), isolation_level="AUTOCOMMIT"
        )
        with cleanup.connect() as connection:
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {service}, {inspector}")
        cleanup.dispose()
