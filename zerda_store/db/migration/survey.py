"""What a database holds before zerda_store uses it: zerda_store's schema at some revision,
nothing, another application's tables, or (Postgres) zerda_store's tables in a schema that
the connection's search_path does not reach. Only reads; the errors say what was found.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ...errors import NotAStoreDatabaseError, SchemaNotCurrentError, StoreError
from ..execution.failures import database_error
from ..schema import contexts, entities, metadata, turns
from ..store import StoreCore, takes_store

# The tables every revision of zerda_store has had: a schema holding all three is ours.
CORE_TABLES = frozenset({turns.name, entities.name, contexts.name})
# The tables zerda_store's schema creates.
OUR_TABLES = frozenset(metadata.tables)
VERSION_TABLE = "alembic_version"
SHOWN_TABLES = 8

_information_tables = sa.table(
    "tables",
    sa.column("table_schema"),
    sa.column("table_name"),
    sa.column("table_type"),
    schema="information_schema",
)


@dataclass(frozen=True)
class Survey:
    """What one connection of a store finds."""

    revision: str | None
    """The Alembic revision (several heads joined by commas), None without one."""
    tables: tuple[str, ...]
    """The tables the connection sees, sorted; an empty version table left out."""
    search_path: str | None = None
    """Postgres: the connection's search_path."""
    current_schema: str | None = None
    """Postgres: the schema new tables go to; None if no schema on the path exists."""
    elsewhere: tuple[str, ...] = ()
    """Postgres: schemas off the search_path that hold zerda_store's tables (looked for
    only when the connection sees none of them)."""

    @property
    def has_our_tables(self) -> bool:
        return set(self.tables) >= CORE_TABLES

    @property
    def taken_names(self) -> tuple[str, ...]:
        """Tables of another application that bear the names of zerda_store's."""
        return tuple(table for table in self.tables if table in OUR_TABLES)


@takes_store
def survey(store: StoreCore) -> Survey:
    """Look at the database without changing it; a database error is zerda_store's."""
    try:
        return _survey(store)
    except DBAPIError as exc:
        raise database_error(store, exc) from None


def _survey(store: StoreCore) -> Survey:
    with store.connect() as connection:
        from alembic.runtime.migration import MigrationContext

        if store.dialect == "postgresql":
            # Every read below from one snapshot: a deploy job that commits a revision
            # meanwhile is seen whole (its tables with their revision) or not at all.
            connection = connection.execution_options(isolation_level="REPEATABLE READ")
            connection.begin()

        heads = MigrationContext.configure(connection).get_current_heads()
        revision = ",".join(heads) if heads else None
        tables = sorted(sa.inspect(connection).get_table_names())
        if revision is None:
            tables = [table for table in tables if table != VERSION_TABLE]
        if store.dialect != "postgresql":
            return Survey(revision, tuple(tables))
        search_path = connection.exec_driver_sql("SHOW search_path").scalar()
        current_schema = connection.exec_driver_sql("SELECT current_schema()").scalar()
        elsewhere = () if CORE_TABLES & set(tables) else _schemas_with_our_tables(connection)
        return Survey(revision, tuple(tables), search_path, current_schema, elsewhere)


def _schemas_with_our_tables(connection: Connection) -> tuple[str, ...]:
    schema = _information_tables.c.table_schema
    query = (
        sa.select(schema)
        .where(
            _information_tables.c.table_name.in_(sorted(CORE_TABLES)),
            _information_tables.c.table_type == "BASE TABLE",
        )
        .group_by(schema)
        .having(sa.func.count() == len(CORE_TABLES))
        .order_by(schema)
    )
    return tuple(connection.execute(query).scalars())


@takes_store
def upgrade_command(store: StoreCore) -> str:
    """The command line that creates or upgrades zerda_store's schema in this store's
    database: its URL as written, password masked, quoted for a POSIX shell (for a store
    behind a transaction pooler, a placeholder for the server's own URL)."""
    schema = f" --schema {shlex.quote(store.schema)}" if store.schema else ""
    if store.prepared_statements is False:  # never through a transaction pooler
        return (
            f"zerda-store --database-url SERVER_URL{schema} db upgrade` (SERVER_URL: the "
            "database on the server itself, not through the transaction pooler)`"
        )
    return f"zerda-store --database-url {shlex.quote(store.safe_url)}{schema} db upgrade"


def _listing(tables: Sequence[str]) -> str:
    shown = ", ".join(tables[:SHOWN_TABLES])
    more = len(tables) - SHOWN_TABLES
    return f"{shown} and {more} more" if more > 0 else shown


def hidden_schema_error(store: StoreCore, found: Survey) -> NotAStoreDatabaseError:
    """Our tables are in another schema than the one the connection uses."""
    schemas = ", ".join(found.elsewhere)
    first = found.elsewhere[0]
    return NotAStoreDatabaseError(
        f"{store.location} has no zerda_store tables on the connection's search_path "
        f"({found.search_path}), but schema {schemas} has them: choose it with "
        f'Store(url, schema="{first}"), `zerda-store --schema {first}`, or '
        f"?options=-csearch_path%3D{first} in the URL"
    )


def not_ours_error(store: StoreCore, found: Survey) -> NotAStoreDatabaseError:
    """The database has no revision of ours: empty, or another application's tables."""
    if found.elsewhere:
        return hidden_schema_error(store, found)
    if not found.tables:
        return NotAStoreDatabaseError(
            f"{store.location} is not a zerda_store database (it is empty): run "
            f"`{upgrade_command(store)}` to create zerda_store's tables (in Python: "
            "auto_migrate=True)"
        )
    return NotAStoreDatabaseError(
        f"{store.location} is not a zerda_store database (it has tables "
        f"{_listing(found.tables)}); `{upgrade_command(store)}` would add zerda_store's "
        "tables beside them"
    )


def taken_names_error(store: StoreCore, found: Survey) -> NotAStoreDatabaseError:
    """Another application's tables bear the names of zerda_store's: nothing can be
    created beside them."""
    return NotAStoreDatabaseError(
        f"{store.location} is not a zerda_store database: it has another application's "
        f"tables named as zerda_store's ({_listing(found.taken_names)}); it was left "
        "unchanged: use another database or file for zerda_store"
    )


def unknown_revision_error(store: StoreCore, found: Survey) -> SchemaNotCurrentError:
    """The version table holds a revision that is not one of ours."""
    if found.elsewhere:
        return hidden_schema_error(store, found)
    if found.has_our_tables:
        return SchemaNotCurrentError(
            f"the zerda_store schema of {store.location} is at revision {found.revision}, "
            "which this version of zerda_store does not know: it was most likely migrated "
            "by a newer version of zerda_store (upgrade the package to use it)"
        )
    return NotAStoreDatabaseError(
        f"{store.location} is not a zerda_store database: its {VERSION_TABLE} holds "
        f"revision {found.revision}, which is not one of zerda_store's, and none of "
        f"zerda_store's tables are there (it has tables {_listing(found.tables)}); it "
        "belongs to another application that uses Alembic"
    )


def require_ours(store: StoreCore, found: Survey, known: Collection[str]) -> str:
    """The revision of a database that holds zerda_store's schema at a revision this
    version knows; otherwise the error that says what is there instead."""
    if found.revision is None:
        raise not_ours_error(store, found)
    if found.revision not in known:
        raise unknown_revision_error(store, found)
    return found.revision


def record_behind_tables(store: StoreCore, revision: str | None, found: str) -> StoreError:
    """An upgrade that met a table or index of a later revision (``found``: which, or the
    error that met it): the version record was set back by hand (or restored apart from
    the tables). Nothing was changed."""
    return SchemaNotCurrentError(
        f"the database {store.safe_url} records revision {revision}, but holds what a later "
        f"revision makes ({found}): its version record does not match its "
        f"tables (set back by hand?){'; nothing was changed' if store.dialect == 'sqlite' else ''}. "
        "Set the record to the revision the tables are at (`alembic stamp REVISION`), or "
        "restore the database whole"
    )
