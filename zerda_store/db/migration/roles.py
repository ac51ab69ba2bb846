"""Least privilege on Postgres: what ``zerda-store db grant`` gives the two roles beside the
owner of zerda_store's tables.

- The **owner** (who ran ``db upgrade``) changes the schema: ``db upgrade``, ``db contract``,
  ``db distribute``, and this grant.
- The **service** role runs the memory: SELECT, INSERT, UPDATE, DELETE on zerda_store's
  tables, USAGE on the sequences of their ids (``nextval``), SELECT on the version table and
  the views, USAGE on the schema; it owns nothing and creates nothing.
- The **inspector** reads: SELECT on the tables, the version table and the views, USAGE on
  the schema.

Default privileges (``ALTER DEFAULT PRIVILEGES FOR ROLE owner IN SCHEMA ...``) give the same
to the tables, views and sequences the owner creates there later (a later revision's new
table, a view a revision re-creates). The advisory-lock functions and ``hashtext`` are
executable by everyone: nothing is granted on functions. Nothing is revoked: a grant only
adds, so running it again changes nothing. On Citus each GRANT goes through the coordinator,
which passes grants on distributed and reference tables on to their shards. The operator's
side of it: docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import IdentifierPreparer

from ...errors import PermissionDeniedError, RefusedValueError, StoreError
from ..execution.failures import database_error, is_permission_denied
from ..schema import metadata
from ..store import StoreCore, takes_store
from . import migrate
from .lock import locked_connection
from .survey import VERSION_TABLE

SERVICE_TABLES = "SELECT, INSERT, UPDATE, DELETE"
SERVICE_SEQUENCES = "USAGE"
READING = "SELECT"
# The views the revisions create (older revisions have fewer), for SQL inspection.
VIEWS = ("entity_overview", "entity_snippets")

_WHERE = sa.text(
    "SELECT n.nspname AS schema, pg_get_userbyid(c.relowner) AS owner, "
    "current_user AS connected, pg_has_role(current_user, c.relowner, 'USAGE') AS may_grant "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.oid = to_regclass('turns')"
)
_RELATIONS = sa.text(
    "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = :schema AND c.relname = ANY(:names) AND c.relkind IN ('r', 'p', 'v') "
    "ORDER BY c.relname"
)
# The sequences that give the tables' ids (serial columns own theirs, identity columns too).
_SEQUENCES = sa.text(
    "SELECT DISTINCT s.relname FROM pg_class s "
    "JOIN pg_namespace n ON n.oid = s.relnamespace "
    "JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid "
    "AND d.deptype IN ('a', 'i') "
    "JOIN pg_class t ON t.oid = d.refobjid "
    "WHERE s.relkind = 'S' AND n.nspname = :schema AND t.relnamespace = s.relnamespace "
    "AND t.relname = ANY(:tables) ORDER BY s.relname"
)
_ROLES = sa.text(
    "SELECT rolname, rolsuper, pg_has_role(rolname, :owner, 'MEMBER') AS owns "
    "FROM pg_roles WHERE rolname = ANY(:roles)"
)
_CREATING = sa.text(
    "SELECT has_schema_privilege(:role, :schema, 'CREATE') AS in_schema, "
    "has_database_privilege(:role, current_database(), 'CREATE') AS in_database, "
    "has_database_privilege(:role, current_database(), 'CONNECT') AS connects, "
    "current_database() AS database"
)


@dataclass(frozen=True)
class Objects:
    """zerda_store's objects in one database: where they are, who owns them, and which."""

    schema: str
    owner: str
    tables: tuple[str, ...]
    """zerda_store's tables, the version table left out."""
    views: tuple[str, ...]
    sequences: tuple[str, ...]


@dataclass
class Grant:
    """What ``db grant`` runs (or, dry, would run) and what it found."""

    schema: str
    owner: str
    service: str | None
    inspector: str | None
    created: list[str] = field(default_factory=list)
    """The roles it creates (NOLOGIN)."""
    statements: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What lets a role do more than it should and that the grant does not take away."""


def statements(
    objects: Objects,
    *,
    service: str | None,
    inspector: str | None,
    create: Sequence[str] = (),
    quote: IdentifierPreparer,
) -> list[str]:
    """The SQL that gives ``service`` and ``inspector`` their privileges on ``objects`` (and
    creates the roles in ``create``); built without I/O."""
    schema = quote.quote_schema(objects.schema)

    def named(names: Sequence[str]) -> str:
        return ", ".join(f"{schema}.{quote.quote(name)}" for name in names)

    owner = quote.quote(objects.owner)
    defaults = f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema} GRANT"
    reads = (*objects.tables, VERSION_TABLE, *objects.views)
    sql = [f"CREATE ROLE {quote.quote(role)} NOLOGIN" for role in create]
    if service is not None:
        role = quote.quote(service)
        sql.append(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        sql.append(f"GRANT {SERVICE_TABLES} ON TABLE {named(objects.tables)} TO {role}")
        sql.append(f"GRANT {READING} ON TABLE {named((VERSION_TABLE, *objects.views))} TO {role}")
        if objects.sequences:
            sql.append(
                f"GRANT {SERVICE_SEQUENCES} ON SEQUENCE {named(objects.sequences)} TO {role}"
            )
        sql.append(f"{defaults} {SERVICE_TABLES} ON TABLES TO {role}")
        sql.append(f"{defaults} {SERVICE_SEQUENCES} ON SEQUENCES TO {role}")
    if inspector is not None:
        role = quote.quote(inspector)
        sql.append(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        sql.append(f"GRANT {READING} ON TABLE {named(reads)} TO {role}")
        sql.append(f"{defaults} {READING} ON TABLES TO {role}")
    return sql


@takes_store
def plan(
    store: StoreCore, *, service: str | None, inspector: str | None, create: bool = False
) -> Grant:
    """What :func:`grant` would run, with the same refusals; changes nothing."""
    _refuse_misuse(store, service, inspector)
    with store.connect() as connection:
        return _planned(connection, store, service, inspector, create)


@takes_store
def grant(
    store: StoreCore, *, service: str | None, inspector: str | None, create: bool = False
) -> Grant:
    """Give the service role and the inspection role their privileges on zerda_store's
    objects, in one transaction under the migrations' lock (an upgrade running meanwhile
    finishes first). ``create``: make the roles that do not exist, NOLOGIN (grant them to
    login roles, or ALTER ROLE ... LOGIN). Run by the owner of the tables (or a superuser).
    Refused, changing nothing, for a role that owns the tables or is a superuser."""
    store.check_writable()
    _refuse_misuse(store, service, inspector)
    try:
        with locked_connection(store) as connection:
            done = _planned(connection, store, service, inspector, create)
            for statement in done.statements:
                connection.exec_driver_sql(statement)
            done.warnings = _warnings(connection, done)
            return done
    except DBAPIError as exc:
        if exc.orig is not None and is_permission_denied(exc.orig):
            raise PermissionDeniedError(
                f"the role of {store.safe_url} may not grant or create roles "
                f"({store.describe(exc)}): run `db grant` as the owner of zerda_store's "
                "tables (creating roles needs CREATEROLE); nothing was granted"
            ) from None
        raise database_error(store, exc) from None


def _refuse_misuse(store: StoreCore, service: str | None, inspector: str | None) -> None:
    if store.dialect != "postgresql":
        raise StoreError(
            f"{store.location} is a {store.dialect} database, which has no roles: "
            "`db grant` is for Postgres (on SQLite, the file's permissions decide who reads it)"
        )
    if service is None and inspector is None:
        raise RefusedValueError("name a role to grant to: --service ROLE, --inspector ROLE or both")
    if service is not None and service == inspector:
        raise RefusedValueError(
            f"{service!r} cannot be both the service and the inspector: an inspector never "
            "writes; give them two roles"
        )


def _planned(
    connection: Connection,
    store: StoreCore,
    service: str | None,
    inspector: str | None,
    create: bool,
) -> Grant:
    objects = _objects(connection, store)
    roles = [role for role in (service, inspector) if role is not None]
    missing = _checked_roles(connection, store, objects, roles)
    if missing and not create:
        named = " or ".join(missing)
        raise StoreError(
            f"{store.location} has no role {named}: create it first (CREATE ROLE name LOGIN "
            "PASSWORD '...'), or pass --create to make it NOLOGIN and grant it to login roles; "
            "nothing was granted"
        )
    done = Grant(objects.schema, objects.owner, service, inspector, created=missing)
    done.statements = statements(
        objects,
        service=service,
        inspector=inspector,
        create=missing,
        quote=connection.dialect.identifier_preparer,
    )
    done.warnings = _warnings(connection, done)
    return done


def _objects(connection: Connection, store: StoreCore) -> Objects:
    where = connection.execute(_WHERE).first()
    if where is None:  # the error that says what the database holds instead
        migrate.require_store_database(store)
        raise StoreError(f"{store.location} has no zerda_store tables on the search_path")
    if not where.may_grant:
        raise PermissionDeniedError(
            f"{store.safe_url} connects as {where.connected}, which does not own zerda_store's "
            f"tables (their owner is {where.owner}): run `db grant` with the owner's URL (or "
            "a superuser's); nothing was granted"
        )
    migrate.require_store_database(store)
    ours = sorted({*metadata.tables, *VIEWS})
    found = connection.execute(_RELATIONS, {"schema": where.schema, "names": ours}).all()
    tables = tuple(row.relname for row in found if row.relkind != "v")
    sequences = connection.execute(_SEQUENCES, {"schema": where.schema, "tables": list(tables)})
    return Objects(
        schema=where.schema,
        owner=where.owner,
        tables=tables,
        views=tuple(row.relname for row in found if row.relkind == "v"),
        sequences=tuple(sequences.scalars()),
    )


def _checked_roles(
    connection: Connection, store: StoreCore, objects: Objects, roles: Sequence[str]
) -> list[str]:
    """The roles of ``roles`` that do not exist; refused: one that owns the tables (or is a
    member of their owner) or a superuser, as either bypasses every privilege."""
    found = {
        row.rolname: row
        for row in connection.execute(_ROLES, {"owner": objects.owner, "roles": list(roles)})
    }
    for role in roles:
        row = found.get(role)
        if row is not None and (row.rolsuper or row.owns):
            why = "a superuser" if row.rolsuper else f"the owner of the tables ({objects.owner})"
            raise StoreError(
                f"role {role} is {why} on {store.location}: it would bypass the privileges "
                "granted; the service and the inspector need roles of their own"
            )
    return [role for role in roles if role not in found]


def _warnings(connection: Connection, done: Grant) -> list[str]:
    """What lets the service or the inspector create objects (a grant to PUBLIC, as before
    Postgres 15 on schema public, or to the role); said, not revoked (it is shared)."""
    warnings = []
    for role in (done.service, done.inspector):
        if role is None:
            continue
        exists = connection.execute(_ROLES, {"owner": done.owner, "roles": [role]}).first()
        if exists is None:
            continue
        may = connection.execute(_CREATING, {"role": role, "schema": done.schema}).one()
        if may.in_schema:
            warnings.append(
                f"{role} may create objects in schema {done.schema} (CREATE granted to it or "
                f"to PUBLIC): REVOKE CREATE ON SCHEMA {done.schema} FROM PUBLIC, {role}"
            )
        if not may.connects:
            warnings.append(
                f"{role} may not connect to database {may.database} (CONNECT revoked from "
                f"PUBLIC): GRANT CONNECT ON DATABASE {may.database} TO {role}"
            )
        if may.in_database:
            warnings.append(
                f"{role} may create schemas in this database (CREATE granted to it or to "
                f"PUBLIC): REVOKE CREATE ON DATABASE {may.database} FROM PUBLIC, {role}"
            )
    return warnings
