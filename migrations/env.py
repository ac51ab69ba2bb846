"""Alembic environment for zerda_store.

``zerda-store db ...`` and the library pass an open connection, holding the migration
lock, through ``config.attributes["connection"]``: inside one transaction (SQLite; every
downgrade), or on Postgres for an upgrade outside any, so that each revision commits on its
own and releases its locks before the next. Run as plain
``alembic``, the URL comes from ``-x url=...`` or ``ZERDA_STORE_DATABASE_URL``.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

from zerda_store import migrate
from zerda_store.db.engine import Store
from zerda_store.db.schema import metadata

config = context.config


def _included(dialect: str) -> Any:
    """What autogenerate compares: all of the schema, but on Postgres the unique
    ``(session_id, id)`` of turns and entities, which the primary key is there (0007)."""

    def included(item: Any, name: str | None, kind: str, reflected: bool, other: Any) -> bool:
        served_by_primary_key = (name or "").endswith("_session_id_id")
        return not (
            dialect == "postgresql" and kind == "unique_constraint" and served_by_primary_key
        )

    return included


def run_migrations(connection: Connection) -> None:
    if (
        connection.dialect.name == "sqlite"
        and connection.exec_driver_sql("PRAGMA foreign_keys").scalar()
    ):
        # Batch migrations copy and drop tables; with foreign keys on, the drop would
        # cascade into the child tables and delete their rows.
        raise RuntimeError(
            "SQLite migrations must run with foreign keys off: use `zerda-store db upgrade` "
            "or zerda_store.db.migrate, which switch them off and check them afterwards"
        )
    # Handed over outside a transaction on Postgres, revisions may commit as they go (a
    # backfill in batches, a constraint validated apart): see 0005.
    config.attributes["online_ddl"] = (
        connection.dialect.name == "postgresql" and not connection.in_transaction()
    )
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_server_default=connection.dialect.name == "postgresql",
        # On Postgres, a connection handed over outside a transaction (`db upgrade`)
        # commits each revision on its own, releasing its locks before the next.
        transaction_per_migration=connection.dialect.name == "postgresql",
        include_object=_included(connection.dialect.name),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_from_command_line() -> None:
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    url = context.get_x_argument(as_dictionary=True).get("url")
    with Store(url) as store:
        creating = migrate.current_revision(store) is None
        with migrate.locked_connection(store) as connection:
            run_migrations(connection)
        if creating and store.dialect == "sqlite" and migrate.current_revision(store):
            migrate.switch_to_wal(store)  # as `zerda-store db upgrade` does when it creates


if context.is_offline_mode():
    raise SystemExit("offline (--sql) mode is not supported: run against a database")

connection = config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
else:
    run_from_command_line()
