"""Schema management through Alembic, usable from an installed wheel.

The revisions live in the top-level ``migrations/`` folder of the repository; the wheel
carries a copy inside the package. Upgrades on Postgres hold an advisory lock, and on SQLite
an IMMEDIATE transaction, so concurrent deploy jobs apply each revision exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TextIO

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection

from .engine import Store
from .errors import SchemaNotCurrentError

# Any constant will do; it only has to be the same in every process that migrates.
_ADVISORY_LOCK_KEY = 0x7A657264  # "zerd"
MIGRATION_WAIT_MS = 600_000


def migrations_dir() -> Path:
    """Where the revisions are: inside the installed package, else the repository checkout."""
    packaged = Path(__file__).parent / "migrations"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "migrations"


def alembic_config(connection: Connection | None = None, stdout: TextIO | None = None) -> Config:
    """An Alembic configuration for the packaged revisions, optionally bound to a connection."""
    config = Config(stdout=stdout) if stdout is not None else Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@cache
def head_revision() -> str:
    """The newest revision this version of zerda_store knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations folder has no revisions"
    return head


@cache
def known_revisions() -> frozenset[str]:
    """Every revision of the packaged migrations."""
    script = ScriptDirectory.from_config(alembic_config())
    return frozenset(revision.revision for revision in script.walk_revisions())


def current_revision(store: Store) -> str | None:
    """The database's revision, or None for a database Alembic never touched."""
    with store.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _raw_sqlite(connection: Connection, pragma: str) -> None:
    connection.connection.driver_connection.execute(pragma)  # type: ignore[union-attr]


@contextmanager
def locked_connection(store: Store) -> Iterator[Connection]:
    """A connection in one transaction that only one migrating process holds at a time.

    On SQLite foreign keys are switched off for the duration (batch migrations copy tables)
    and checked before the commit.
    """
    with store.connect() as connection:
        if store.dialect == "sqlite":
            # Outside any transaction, where SQLite honours it; the driver is in autocommit.
            _raw_sqlite(connection, "PRAGMA foreign_keys=OFF")
            # Another process may be rebuilding a large table: wait for it, not 5 s.
            _raw_sqlite(connection, f"PRAGMA busy_timeout={MIGRATION_WAIT_MS}")
            connection.execution_options(sqlite_begin="IMMEDIATE")
        try:
            with connection.begin():
                if store.dialect == "postgresql":
                    # Waiting for another deploy job, or for the locks of running saves, is
                    # expected here: wait long, not the store's lock_timeout.
                    connection.exec_driver_sql(f"SET LOCAL lock_timeout = {MIGRATION_WAIT_MS}")
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK_KEY}
                    )
                yield connection
                if store.dialect == "sqlite":
                    problems = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if problems:
                        raise SchemaNotCurrentError(f"migration broke foreign keys: {problems[:5]}")
        finally:
            if store.dialect == "sqlite":
                _raw_sqlite(connection, "PRAGMA foreign_keys=ON")
                _raw_sqlite(connection, f"PRAGMA busy_timeout={round(store.lock_timeout * 1000)}")


def upgrade(store: Store, revision: str = "head") -> None:
    """Upgrade the schema (one process at a time; the others then find nothing to do)."""
    with locked_connection(store) as connection:
        command.upgrade(alembic_config(connection), revision)


def downgrade(store: Store, revision: str) -> None:
    """Downgrade the schema to ``revision`` ("base" drops every table)."""
    with locked_connection(store) as connection:
        command.downgrade(alembic_config(connection), revision)


def check(store: Store) -> None:
    """Raise ``alembic.util.exc.AutogenerateDiffsDetected`` if the tables differ from the code."""
    with locked_connection(store) as connection:
        command.check(alembic_config(connection))


def ensure_schema(store: Store, auto_migrate: bool | None) -> None:
    """Make sure the database is at head: upgrade it (SQLite by default) or say how to."""
    if store.schema_checked:
        return
    with store.schema_lock:
        if store.schema_checked:
            return
        if auto_migrate is None:
            auto_migrate = store.dialect == "sqlite"
        current = current_revision(store)
        if current is not None and current not in known_revisions():
            raise SchemaNotCurrentError(
                f"the database schema of {store.safe_url} is at revision {current}, which this "
                "version of zerda_store does not know: it was migrated by a newer version"
            )
        if current != head_revision():
            if not auto_migrate:
                raise SchemaNotCurrentError(
                    f"the database schema of {store.safe_url} is at revision "
                    f"{current or 'none (empty database)'}, "
                    f"this version of zerda_store needs {head_revision()}: run "
                    "`zerda-store db upgrade` (or `alembic upgrade head`) against it first"
                )
            upgrade(store)
        store.schema_checked = True
