"""Least privilege on Postgres: the owner upgrades and runs `db grant`; the service role it
grants to runs every memory operation and cannot change the schema; the inspector reads the
tables and views and cannot write (docs/operations.md).

Roles are cluster-wide: each test makes its own, with names of its own, and drops them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.cli.helpers import invoke, json_of, one_line_error, succeeded, usage_error
from tests.doubles import POSTGRES_ADMIN_URL, KeywordLLM
from zerda_store import ConversationEntityMemory, Store, migrate
from zerda_store.errors import PermissionDeniedError, StoreError

pytestmark = pytest.mark.postgres

NAMES = ("Sarah Chen", "Acme Corp", "Berlin", "Omar Haddad", "Globex")
SCHEMA = "memory_zone"


@dataclass(frozen=True)
class Roles:
    """A database made by its owner (at head, unless made empty), and the roles beside it."""

    database: str
    owner: str
    service: str
    inspector: str
    schema: str | None
    stores: list[Store] = field(default_factory=list, compare=False)

    def url(self, role: str) -> str:
        url = sa.make_url(POSTGRES_ADMIN_URL).set(database=self.database, username=role)
        return url.render_as_string(hide_password=False)

    @property
    def owner_url(self) -> str:
        return self.url(self.owner)

    @property
    def service_url(self) -> str:
        return self.url(self.service)

    @property
    def inspector_url(self) -> str:
        return self.url(self.inspector)

    @property
    def admin_url(self) -> str:
        url = sa.make_url(POSTGRES_ADMIN_URL).set(database=self.database)
        return url.render_as_string(hide_password=False)

    def cli(self, role: str, *args: str):
        schema = ("--schema", self.schema) if self.schema else ()
        return invoke(self.url(role), *schema, *args)

    def memory(self, role: str, session_id: str, **options: Any) -> ConversationEntityMemory:
        """A memory as ``role``; on the schema of ``schema=`` through a store of its own,
        which :func:`drop_roles` closes."""
        where: dict[str, Any] = {"database_url": self.url(role)}
        if self.schema:
            where = {"store": Store(self.url(role), schema=self.schema)}
            self.stores.append(where["store"])
        return ConversationEntityMemory(
            KeywordLLM(NAMES), session_id=session_id, **where, **options
        )


def make_roles(admin: sa.Engine, *, schema: str | None = None, at_head: bool = True):
    suffix = uuid.uuid4().hex[:10]
    roles = Roles(
        database=f"zerda_test_roles_{suffix}",
        owner=f"zerda_owner_{suffix}",
        service=f"zerda_service_{suffix}",
        inspector=f"zerda_inspector_{suffix}",
        schema=schema,
    )
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {roles.owner} LOGIN")
        connection.exec_driver_sql(f"CREATE ROLE {roles.service} LOGIN")
        connection.exec_driver_sql(f"CREATE ROLE {roles.inspector} LOGIN")
        connection.exec_driver_sql(f"CREATE DATABASE {roles.database} OWNER {roles.owner}")
    if at_head:
        with Store(roles.owner_url, schema=schema) as store:
            migrate.upgrade(store)
    return roles


def drop_roles(admin: sa.Engine, roles: Roles, *extra: str) -> None:
    for store in roles.stores:
        store.close()
    names = ", ".join((roles.service, roles.inspector, *extra))
    with admin.connect() as connection:
        if not connection.exec_driver_sql(
            "SELECT 1 FROM pg_database WHERE datname = %s", (roles.database,)
        ).first():
            return  # dropped already
    engine = sa.create_engine(roles.admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            known = connection.exec_driver_sql(
                "SELECT string_agg(rolname, ', ') FROM pg_roles WHERE rolname = ANY(%s)",
                ([roles.service, roles.inspector, *extra],),
            ).scalar()
            if known:  # their privileges and default privileges in this database
                connection.exec_driver_sql(f"DROP OWNED BY {known}")
    finally:
        engine.dispose()
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {roles.database} WITH (FORCE)")
        connection.exec_driver_sql(f"DROP ROLE IF EXISTS {names}, {roles.owner}")


@pytest.fixture
def roles(postgres_admin: sa.Engine) -> Iterator[Roles]:
    """A database at head made by its owner; the service and the inspector roles exist and
    hold nothing yet."""
    made = make_roles(postgres_admin)
    yield made
    drop_roles(postgres_admin, made)


@pytest.fixture(params=[None, SCHEMA], ids=["search_path", "schema"])
def granted(request: pytest.FixtureRequest, postgres_admin: sa.Engine) -> Iterator[Roles]:
    """As ``roles``, after the owner's `db grant` (on the default schema, or on the one the
    store's ``schema=`` names)."""
    made = make_roles(postgres_admin, schema=request.param)
    try:
        succeeded(made.cli(made.owner, "db", "grant", "--service", made.service,
                           "--inspector", made.inspector))  # fmt: skip
        yield made
    finally:
        drop_roles(postgres_admin, made)


def run_sql(url: str, statement: str) -> list[tuple]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as connection:
            result = connection.exec_driver_sql(statement)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def refused(url: str, statement: str) -> str:
    """The error of a statement the role is not allowed to run."""
    with pytest.raises(sa.exc.ProgrammingError) as caught:
        run_sql(url, statement)
    assert getattr(caught.value.orig, "sqlstate", None) == "42501", caught.value
    return str(caught.value.orig)


def in_schema(roles: Roles, name: str) -> str:
    return f"{roles.schema}.{name}" if roles.schema else name


# -- the service role ----------------------------------------------------------------------


def test_service_role_runs_every_memory_operation(granted: Roles):
    with granted.memory(granted.service, "acme") as memory:
        memory.save_context({"input": "Sarah Chen of Acme Corp called."}, {"output": "Noted."})
        memory.save_context(
            {"input": "Sarah Chen flies to Berlin."}, {"output": "OK."}, idempotency_key="t-2"
        )
        memory.save_context({"input": "again"}, {"output": "again"}, idempotency_key="t-2")
        assert (
            memory.save_contexts(
                [({"input": "Omar Haddad joined Acme Corp."}, {"output": "Welcome."})] * 10
            )
            == 10
        )
        recalled = memory.load_memory_variables({"input": "What about Sarah Chen?"})
        assert "Sarah Chen flies to Berlin." in recalled["entity_info"]
        assert memory.list_entities() == ["Sarah Chen", "Acme Corp", "Berlin", "Omar Haddad"]
        assert memory.get_memory_stats()["message_count"] == 12
        assert len(memory.chat_memory) == 12

        assert memory.add_alias("Sarah Chen", "Sarah") is True
        assert memory.get_entity_info("Sarah")["name"] == "Sarah Chen"
        merge = memory.merge_entities("Acme Corp", "Omar Haddad")
        assert memory.merges()[0]["merge_id"] == merge["merge_id"]
        memory.unmerge(merge["merge_id"])
        assert "Omar Haddad" in memory.list_entities()

        memory.set_retention(keep_last=1)
        assert memory.get_retention()["keep_last"] == 1
        assert memory.prune()["snippets"] > 0
        assert memory.clear_retention() == 1

        assert memory.forget_entity("Berlin")["entities"] == 1
        assert memory.reextract() == {"repaired": 0, "failed": 0}
        memory.clear()
        assert memory.list_entities() == []
        assert memory.get_memory_stats()["message_count"] == 0


def test_service_role_runs_the_async_calls(granted: Roles):
    async def run() -> str:
        async with granted.memory(granted.service, "async") as memory:
            await memory.asave_context({"input": "Globex hired Omar Haddad."}, {"output": "Ok."})
            recalled = await memory.aload_memory_variables({"input": "And Globex?"})
            await memory.aforget_entity("Omar Haddad")
            await memory.aclear()
            return str(recalled["entity_info"])

    assert "Globex hired Omar Haddad." in asyncio.run(run())


def test_service_role_exports_imports_and_prunes_through_the_cli(granted: Roles, tmp_path: Path):
    with granted.memory(granted.service, "acme") as memory:
        memory.save_context({"input": "Sarah Chen of Acme Corp called."}, {"output": "Noted."})
    exported = tmp_path / "acme.jsonl"
    service = granted.service

    succeeded(granted.cli(service, "export", "--session", "acme", "-o", str(exported)))
    imported = json_of(granted.cli(service, "import", str(exported), "--session", "copy", "--json"))
    assert imported["turns"] == 1
    assert json_of(granted.cli(service, "entities", "--session", "copy", "--json"))[0]["name"] == (
        "Sarah Chen"
    )
    copied = tmp_path / "copy.db"
    succeeded(granted.cli(service, "copy", "--to", f"sqlite:///{copied}", "--session", "acme"))
    succeeded(granted.cli(service, "retention", "set", "--default", "--keep-last", "1"))
    assert json_of(granted.cli(service, "prune", "--yes", "--json"))["sessions"] == 0
    forgot = json_of(
        granted.cli(service, "forget", "--yes", "Acme Corp", "--session", "copy", "--json")
    )
    assert forgot["entities"] == 1


def test_service_role_cannot_change_the_schema(granted: Roles):
    url = granted.service_url
    turns = in_schema(granted, "turns")

    assert "permission denied" in refused(
        url, f"CREATE TABLE {in_schema(granted, 'spare')} (i int)"
    )
    refused(url, f"ALTER TABLE {turns} ADD COLUMN spare int")
    refused(url, f"DROP TABLE {turns}")
    refused(url, f"CREATE INDEX spare ON {turns} (created_at)")
    refused(url, f"TRUNCATE {turns}")
    refused(url, "CREATE SCHEMA spare")
    refused(url, f"UPDATE {in_schema(granted, 'alembic_version')} SET version_num = 'x'")
    for command in (("db", "contract"), ("db", "downgrade", "base", "--yes")):
        line = one_line_error(granted.cli(granted.service, *command))
        assert f"the role {granted.service} of " in line
        assert "cannot change the schema" in line and " ".join(command[:2]) in line


def test_upgrade_under_the_service_role_says_the_owner_runs_it(
    roles: Roles, postgres_admin: sa.Engine
):
    with Store(roles.owner_url) as store:
        migrate.downgrade(store, "-1")
    succeeded(roles.cli(roles.owner, "db", "grant", "--service", roles.service))

    with pytest.raises(PermissionDeniedError) as caught:
        roles.memory(roles.service, "acme", auto_migrate=True)
    message = str(caught.value)
    assert f"the role {roles.service}" in message
    assert "cannot change the schema" in message
    assert "have the owner run `zerda-store --database-url OWNER_URL db upgrade`" in message

    line = one_line_error(roles.cli(roles.service, "db", "upgrade"))
    assert "cannot change the schema" in line
    assert migrate.current_revision(Store(roles.owner_url)) != migrate.head_revision()


def test_roles_keep_their_privileges_across_the_owners_upgrade(roles: Roles):
    with Store(roles.owner_url) as store:
        migrate.downgrade(store, "0007")  # 0008 and later re-create the views
    succeeded(roles.cli(roles.owner, "db", "grant", "--service", roles.service,
                        "--inspector", roles.inspector))  # fmt: skip
    succeeded(roles.cli(roles.owner, "db", "upgrade"))

    with roles.memory(roles.service, "acme") as memory:
        memory.save_context({"input": "Sarah Chen of Acme Corp called."}, {"output": "Noted."})
        assert (
            "Sarah Chen of Acme Corp"
            in memory.load_memory_variables({"input": "Sarah Chen"})["entity_info"]
        )
    assert run_sql(roles.inspector_url, "SELECT count(*) FROM entity_snippets") == [(2,)]
    refused(roles.inspector_url, "DELETE FROM turns")


def test_auto_migrate_of_an_empty_database_under_the_service_role_is_refused(
    postgres_admin: sa.Engine,
):
    roles = make_roles(postgres_admin, at_head=False)
    try:
        with pytest.raises(PermissionDeniedError, match="db upgrade"):
            roles.memory(roles.service, "acme", auto_migrate=True)
    finally:
        drop_roles(postgres_admin, roles)


# -- the inspector ---------------------------------------------------------------------------


def test_inspector_reads_the_views_and_tables_and_cannot_write(granted: Roles):
    with granted.memory(granted.service, "acme") as memory:
        memory.save_context({"input": "Sarah Chen of Acme Corp called."}, {"output": "Noted."})
    url = granted.inspector_url

    overview = run_sql(url, f"SELECT name FROM {in_schema(granted, 'entity_overview')}")
    assert sorted(overview) == [("Acme Corp",), ("Sarah Chen",)]
    assert run_sql(url, f"SELECT count(*) FROM {in_schema(granted, 'entity_snippets')}") == [(2,)]
    assert run_sql(url, f"SELECT count(*) FROM {in_schema(granted, 'turns')}") == [(1,)]
    assert run_sql(url, f"SELECT version_num FROM {in_schema(granted, 'alembic_version')}") == [
        (migrate.head_revision(),)
    ]
    refused(url, f"INSERT INTO {in_schema(granted, 'retention_policies')} DEFAULT VALUES")
    refused(url, f"DELETE FROM {in_schema(granted, 'turns')}")
    refused(url, f"CREATE TABLE {in_schema(granted, 'spare')} (i int)")

    sessions = json_of(granted.cli(granted.inspector, "sessions", "--json"))
    assert [row["session_id"] for row in sessions] == ["acme"]
    with (
        granted.memory(granted.inspector, "acme") as memory,
        pytest.raises(StoreError, match="lacks a privilege"),
    ):
        memory.save_context({"input": "Berlin"}, {"output": "ok"})


# -- the command ---------------------------------------------------------------------------


def test_grant_prints_what_it_ran_and_running_it_again_changes_nothing(roles: Roles):
    args = ("db", "grant", "--service", roles.service, "--inspector", roles.inspector, "--json")

    first = json_of(roles.cli(roles.owner, *args))
    again = json_of(roles.cli(roles.owner, *args))

    assert first == again
    assert first["schema"] == "public" and first["owner"] == roles.owner
    assert first["created"] == [] and first["warnings"] == []
    assert (
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE public.compatibility_floor, "
        f"public.contexts, public.entities, public.entity_aliases, public.entity_merges, public.extractions, "
        f"public.identity_judgements, public.retention_policies, public.session_key_rules, "
        f"public.turns TO {roles.service}"
    ) in first["statements"]
    assert (
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {roles.owner} IN SCHEMA public GRANT SELECT ON "
        f"TABLES TO {roles.inspector}"
    ) in first["statements"]
    text = succeeded(roles.cli(roles.owner, *args[:-1])).stdout
    assert f"granted on schema public (owner {roles.owner}) to service {roles.service}" in text


def test_grant_warns_of_what_lets_a_role_create_or_keeps_it_out(roles: Roles):
    run_sql(roles.admin_url, f"GRANT CREATE ON SCHEMA public TO {roles.service}")
    run_sql(roles.admin_url, f"GRANT CREATE ON DATABASE {roles.database} TO {roles.service}")
    run_sql(roles.admin_url, f"REVOKE CONNECT ON DATABASE {roles.database} FROM PUBLIC")

    done = json_of(roles.cli(roles.owner, "db", "grant", "--service", roles.service, "--json"))

    assert [warning.split(":")[1] for warning in done["warnings"]] == [
        f" REVOKE CREATE ON SCHEMA public FROM PUBLIC, {roles.service}",
        f" GRANT CONNECT ON DATABASE {roles.database} TO {roles.service}",
        f" REVOKE CREATE ON DATABASE {roles.database} FROM PUBLIC, {roles.service}",
    ]


def test_dry_run_prints_the_statements_and_grants_nothing(roles: Roles):
    result = succeeded(roles.cli(roles.owner, "db", "grant", "--service", roles.service,
                                 "--dry-run"))  # fmt: skip

    assert f"GRANT USAGE ON SCHEMA public TO {roles.service};" in result.stdout
    refused(roles.service_url, "SELECT count(*) FROM turns")


def test_tables_a_later_revision_creates_are_granted_by_default(granted: Roles):
    later = in_schema(granted, "later_table")
    run_sql(granted.owner_url, f"CREATE TABLE {later} (id bigserial PRIMARY KEY, note text)")

    run_sql(granted.service_url, f"INSERT INTO {later} (note) VALUES ('written')")
    assert run_sql(granted.inspector_url, f"SELECT id, note FROM {later}") == [(1, "written")]
    refused(granted.inspector_url, f"INSERT INTO {later} (note) VALUES ('no')")


def test_grant_refuses_the_owner_a_superuser_and_a_missing_role(roles: Roles):
    def error(*args: str) -> str:
        return one_line_error(roles.cli(roles.owner, "db", "grant", *args))

    assert "the owner of the tables" in error("--service", roles.owner)
    assert "a superuser" in error("--inspector", "postgres")
    assert "no role nobody_here" in error("--service", "nobody_here")
    # options that contradict each other, or no role at all: usage errors (exit 2)
    assert "both the service and the inspector" in usage_error(
        roles.cli(
            roles.owner, "db", "grant", "--service", roles.service, "--inspector", roles.service
        )
    )
    assert "--service ROLE" in usage_error(roles.cli(roles.owner, "db", "grant"))


def test_only_the_owner_may_grant(roles: Roles):
    line = one_line_error(roles.cli(roles.service, "db", "grant", "--inspector", roles.inspector))

    assert f"connects as {roles.service}, which does not own" in line
    assert f"their owner is {roles.owner}" in line


def test_a_superuser_may_grant_and_create_the_roles(roles: Roles, postgres_admin: sa.Engine):
    created = f"{roles.service}_made"
    try:
        done = json.loads(
            succeeded(
                invoke(roles.admin_url, "db", "grant", "--service", created, "--create", "--json")
            ).stdout
        )
        assert done["created"] == [created]
        assert f"CREATE ROLE {created} NOLOGIN" in done["statements"]
        assert f"ALTER DEFAULT PRIVILEGES FOR ROLE {roles.owner} IN SCHEMA public GRANT " in (
            " ".join(done["statements"])
        )
        privileges = run_sql(
            roles.admin_url,
            f"SELECT has_table_privilege('{created}', 'turns', 'INSERT'), "
            f"has_sequence_privilege('{created}', 'turns_id_seq', 'USAGE'), "
            f"rolcanlogin FROM pg_roles WHERE rolname = '{created}'",
        )
        assert privileges == [(True, True, False)]
    finally:
        drop_roles(postgres_admin, roles, created)  # the fixture's then finds nothing


def test_grant_on_sqlite_says_it_is_for_postgres(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'memory.db'}"
    with Store(url) as store:
        migrate.upgrade(store)

    line = one_line_error(invoke(url, "db", "grant", "--service", "app"))

    assert "has no roles" in line and "Postgres" in line
