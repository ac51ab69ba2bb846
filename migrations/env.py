"""Alembic environment for zerda_store.

``zerda-store db ...`` and the library pass an open connection, holding the migration
lock, through ``config.attributes["connection"]``: inside one transaction (every downgrade;
the creation of a new SQLite schema), or for an upgrade outside any, so that each revision
commits on its own and releases its locks before the next (on SQLite, a revision's long
data steps commit in short transactions too: ``zerda_store.db.migration.sqlite_online``).
Run as plain ``alembic``, the URL comes from ``-x url=...`` or ``ZERDA_STORE_DATABASE_URL``.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

from zerda_store.db.migration import lock_waits, migrate
from zerda_store.db.migration.contract import COMPATIBILITY_DEFAULTS
from zerda_store.db.schema import metadata
from zerda_store.db.store import Store

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


def _compared_default(
    context: Any, inspected: Any, column: Any, inspected_default: str | None, *rest: Any
) -> bool | None:
    """Server defaults are compared (None: as Alembic does), but a compatibility default
    that `db contract` dropped is as current as the one `db upgrade` made."""
    contracted = (column.table.name, column.name) in {
        (table, name) for table, name, _ in COMPATIBILITY_DEFAULTS
    }
    return False if contracted and inspected_default is None else None


def _record_applied(*, step, **_: object) -> None:
    """Record each revision this run applied, for `db upgrade` to list (the caller's list
    in ``config.attributes["applied"]``, if it gave one)."""
    applied = config.attributes.get("applied")
    if applied is not None and step.is_upgrade:
        applied.extend(step.up_revision_ids)


def run_migrations(connection: Connection) -> None:
    # Handed over outside a transaction, revisions may commit as they go (a backfill in
    # batches, a constraint validated apart, a SQLite table rebuilt in batches): see 0005.
    online = not connection.in_transaction()
    if (
        connection.dialect.name == "sqlite"
        and connection.exec_driver_sql("PRAGMA foreign_keys").scalar()
    ):
        # Batch migrations copy and drop tables; with foreign keys on, the drop would
        # cascade into the child tables and delete their rows.
        raise RuntimeError(
            "SQLite migrations must run with foreign keys off: use `zerda-store db upgrade` "
            "or zerda_store.db.migration.migrate, which switch them off and check them afterwards"
        )
    if online and connection.in_transaction():
        connection.rollback()  # the check's read: each revision begins a transaction of its own
    postgres = connection.dialect.name == "postgresql"
    config.attributes["online_ddl"] = online
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_server_default=_compared_default if postgres else False,
        # A connection handed over outside a transaction (`db upgrade`) commits each
        # revision on its own, releasing its locks before the next.
        transaction_per_migration=postgres or config.attributes["online_ddl"],
        include_object=_included(connection.dialect.name),
        on_version_apply=_record_applied,
    )
    if not config.attributes["online_ddl"]:
        with context.begin_transaction():
            context.run_migrations()
        return

    def run() -> None:
        with context.begin_transaction():
            context.run_migrations()

    if not postgres:
        run()  # SQLite queues no lock requests: nothing to give way to
        return

    def stopped() -> str:
        return f"db upgrade, the revision after {context.get_context().get_current_revision()}"

    # The transactions of the revisions wait briefly for a table's lock (reads and writes
    # queue behind a waiting request), and the revisions run again after a pause when one
    # gave way: each goes on where it stopped.
    with lock_waits.short_lock_waits(connection):
        lock_waits.retrying_lock_timeouts(connection, run, stopped)


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
