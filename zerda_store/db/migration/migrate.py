"""Schema management through Alembic, usable from an installed wheel.

The revisions live in the top-level ``migrations/`` folder of the repository; the wheel
carries a copy inside the package. Upgrades on Postgres hold an advisory lock, and on SQLite
a lock on a file beside the database, so concurrent deploy jobs apply each revision exactly
once.

Only an upgrade creates zerda_store's schema, and a SQLite file is switched to WAL only then
(WAL stays a property of the file). A store opened read-only is never migrated: upgrade and
downgrade refuse it, and :func:`ensure_schema` only says what to run.
"""

from __future__ import annotations

import io
import logging
import sqlite3
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ...errors import PermissionDeniedError, SchemaNotCurrentError
from .. import statistics
from ..connections.settings import SQLITE_BUSY_TIMEOUT_MS
from ..execution.failures import is_permission_denied
from ..store import StoreCore, takes_store
from . import compatibility, merge_report
from .lock import alembic_connection, commits_per_revision, locked_connection
from .survey import (
    Survey,
    hidden_schema_error,
    not_ours_error,
    record_behind_tables,
    require_ours,
    survey,
    taken_names_error,
    upgrade_command,
)

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported where a function needs it: importing zerda_store, or running a
# command that never migrates, does not load it.

# Where a revision puts what it did to the data, for `zerda-store db upgrade` to print.
UPGRADE_REPORT = "upgrade_report"
ASSUME_NORMALIZED = "assume_normalized"
# The revision an interrupted online 0006 leaves recorded (its work is committed as it goes).
INTERRUPTED_IDENTITY_AT = "0005"


def migrations_dir() -> Path:
    """Where the revisions are: inside the installed package, else the repository checkout."""
    package = Path(__file__).parents[2]
    packaged = package / "migrations"
    return packaged if packaged.is_dir() else package.parent / "migrations"


def alembic_config(connection: Connection | None = None, stdout: TextIO | None = None) -> Config:
    """An Alembic configuration for the packaged revisions, optionally bound to a connection."""
    from alembic.config import Config

    config = Config(stdout=stdout) if stdout is not None else Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@cache
def head_revision() -> str:
    """The newest revision this version of zerda_store knows."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations folder has no revisions"
    return head


@cache
def known_revisions() -> frozenset[str]:
    """Every revision of the packaged migrations."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    return frozenset(revision.revision for revision in script.walk_revisions())


@takes_store
def downgrade_steps(store: StoreCore, revision: str) -> list[tuple[str, str]]:
    """The revisions a downgrade of the database to ``revision`` undoes, newest first, each
    with its file's slug (``0005``, ``retention``); nothing is changed."""
    from alembic.script import ScriptDirectory

    current = require_store_database(store)
    with store.connect() as connection:
        refuse_interrupted_identity(connection, current)
    script = ScriptDirectory.from_config(alembic_config())
    walked = list(script.walk_revisions(base="base", head=current))
    if revision.startswith("-") and revision[1:].isdigit():
        undone = walked[: int(revision[1:])]
    elif revision == "base":
        undone = walked
    else:
        target = script.get_revision(revision)
        if target is None:
            raise SchemaNotCurrentError(f"no revision {revision!r} to downgrade to")
        ids = [step.revision for step in walked]
        undone = walked[: ids.index(target.revision)] if target.revision in ids else []
    return [
        (step.revision, Path(step.path).stem.partition("_")[2].replace("_", " ")) for step in undone
    ]


@takes_store
def current_revision(store: StoreCore) -> str | None:
    """The database's revision, or None for a database Alembic never touched."""
    from alembic.runtime.migration import MigrationContext

    with store.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


@takes_store
def require_store_database(store: StoreCore) -> str:
    """The revision of a zerda_store database whose revision this version knows (head or
    older); for anything else, the error that says what the database holds instead (a
    newer release's: whether this version still runs on it)."""
    found = survey(store)
    if found.revision is not None and found.revision not in known_revisions():
        raise compatibility.newer_schema_error(store, found, known_revisions(), head_revision())
    return require_ours(store, found, known_revisions())


@takes_store
def upgrade(
    store: StoreCore,
    revision: str = "head",
    *,
    assume_normalized: bool | Collection[str] = False,
    report: list[dict[str, Any]] | None = None,
    applied: list[str] | None = None,
    acknowledge: bool = True,
) -> list[dict[str, Any]]:
    """Upgrade the schema (one process at a time; the others then find nothing to do).

    Refused for a database whose revision is not one of zerda_store's, and, on Postgres,
    for creating the schema while zerda_store's tables are in a schema off the search_path
    (unless the store's ``schema=`` chose where to create it).

    Returns what the revisions did to the data, one entry per session a revision re-keyed
    or recorded (``session_id``, ``key_rules``, ``unsure``, ``rekeyed``, and ``merges``:
    each ``merge_id``, ``kept`` and ``merged``), for the operator to read and undo.
    ``assume_normalized``: the sessions (True: every one) whose records do not tell how
    their keys were made (revision 0006) were written with ``normalize_names=True``, so
    they are re-keyed; the others such are kept exact. ``report``: the list to fill, which
    holds what was committed when the upgrade fails (each session's re-keying is committed
    as it goes; empty where the upgrade runs in one transaction: a new schema, or SQLite
    without file locks).

    Once the upgrade is done the report comes from the merge log (:mod:`.merge_report`):
    every "key rules" merge no finished upgrade reported, those of earlier runs stopped
    before reporting included (their sessions with ``rekeyed`` None), each merge with
    ``undone``. ``acknowledge``: mark them reported now (the command line prints first,
    then calls :func:`acknowledge_report`).
    """
    if report is None:
        report = []
    store.check_writable()
    found = survey(store)
    if found.revision is None:
        _prepare_new_schema(store, found)
    elif found.revision not in known_revisions():
        raise compatibility.newer_schema_error(store, found, known_revisions(), head_revision())
    from alembic import command

    # Revision by revision (SQLite: the long data steps in short transactions too), but a
    # new schema in one transaction: there are no rows to wait for, and a creation cut
    # short leaves nothing behind.
    per_revision = commits_per_revision(store) and (
        store.dialect == "postgresql" or found.revision is not None
    )
    if per_revision and store.dialect == "sqlite" and found.revision != head_revision():
        _refuse_record_behind_tables(store, found)
    with (
        _owner_only(store, "db upgrade"),
        locked_connection(store, per_revision=per_revision) as connection,
    ):
        if store.schema is not None:
            _create_postgres_schema(connection, store.schema)
        config = alembic_config(connection)
        config.attributes[UPGRADE_REPORT] = report
        config.attributes["applied"] = applied  # each revision this run applied, if given
        config.attributes[ASSUME_NORMALIZED] = (
            assume_normalized if isinstance(assume_normalized, bool) else set(assume_normalized)
        )
        try:
            command.upgrade(config, revision)
        except BaseException as exc:
            if not per_revision:
                report.clear()  # rolled back with the rest
            if isinstance(exc, DBAPIError) and "already exists" in str(exc.orig):
                raise record_behind_tables(store, found.revision, store.describe(exc)) from None
            raise
    if found.revision is not None and current_revision(store) != found.revision:
        statistics.analyze(store)  # the revisions' data steps may have rewritten many rows
    report[:] = merge_report.unreported(store, report)
    if acknowledge:
        acknowledge_report(store, report)
    return report


# What a SQLite schema is made of, by name (SQLite's own objects left out).
SQLITE_NAMES = "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite%'"


def _refuse_record_behind_tables(store: StoreCore, found: Survey) -> None:
    """SQLite, revision by revision: refuse, before any revision commits, a database holding
    what a revision after the next one makes (its version record set back by hand). What
    the next revision makes may be there: a run of it that was stopped left it, and the
    revision goes on from there."""
    later = _sqlite_names_at(head_revision()) - _sqlite_names_at(_next_revision(found.revision))
    with store.connect() as connection:
        met = sorted(later & set(connection.exec_driver_sql(SQLITE_NAMES).scalars()))
    if met:
        raise record_behind_tables(store, found.revision, ", ".join(met))


def _next_revision(revision: str | None) -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    following = script.get_revision(revision).nextrev if revision else ()
    return next(iter(following), head_revision())


@cache
def _sqlite_names_at(revision: str) -> frozenset[str]:
    """The tables, indexes and views of the SQLite schema at ``revision`` (made in memory)."""
    from alembic import command

    scratch = create_engine("sqlite://")
    alembic_log = logging.getLogger("alembic.runtime.migration")
    alembic_log.disabled = True  # not the upgrade the operator asked for: not in its log
    try:
        with scratch.connect() as connection:
            with connection.begin():
                command.upgrade(alembic_config(connection), revision)
            return frozenset(connection.exec_driver_sql(SQLITE_NAMES).scalars())
    finally:
        alembic_log.disabled = False
        scratch.dispose()


@takes_store
def acknowledge_report(store: StoreCore, report: list[dict[str, Any]]) -> None:
    """Mark the merges of an upgrade's report reported: the next ``db upgrade`` leaves them
    out (call it once the report is shown)."""
    merge_report.mark_reported(store, report, time.time())


@contextmanager
def _owner_only(store: StoreCore, command: str) -> Iterator[None]:
    """Turn a missing privilege during a schema change into the error that says whose change
    it is: a service role (see ``zerda-store db grant``) cannot make it, the owner can."""
    try:
        yield
    except DBAPIError as exc:
        if exc.orig is None or not is_permission_denied(exc.orig):
            raise
        schema = f" --schema {store.schema}" if store.schema else ""
        then = " (open this role's stores with auto_migrate=False)" if "upgrade" in command else ""
        raise PermissionDeniedError(
            f"the role {store.url.username} of {store.location} cannot change the schema "
            f"({store.describe(exc)}): schema changes are made by the owner of zerda_store's "
            f"tables: have the owner run `zerda-store --database-url OWNER_URL{schema} "
            f"{command}`{then}"
        ) from None


def _schema_chosen(store: StoreCore) -> bool:
    """Whether the schema to create in was chosen: ``schema=``, or a search_path in the
    URL's options (``?options=-csearch_path%3Dname``)."""
    options = store.url.query.get("options", "")
    return store.schema is not None or "search_path" in str(options)


def _prepare_new_schema(store: StoreCore, found: Survey) -> None:
    if found.taken_names:
        raise taken_names_error(store, found)
    if found.elsewhere and not _schema_chosen(store):
        raise hidden_schema_error(store, found)
    if store.dialect == "postgresql" and found.current_schema is None and store.schema is None:
        raise SchemaNotCurrentError(
            f"no schema on the search_path ({found.search_path}) of {store.location} exists: "
            "create it first (CREATE SCHEMA ...), or choose the schema with schema= / "
            "`zerda-store --schema`, which `db upgrade` creates"
        )
    if store.dialect == "sqlite":
        switch_to_wal(store)


def _create_postgres_schema(connection: Connection, schema: str) -> None:
    """Create the chosen schema if it is missing (under the migration lock, so two deploy
    jobs do not both create it; asked only when missing, as CREATE SCHEMA IF NOT EXISTS
    needs the CREATE privilege even when it exists)."""
    exists = connection.execute(
        text("SELECT 1 FROM pg_namespace WHERE nspname = :schema"), {"schema": schema}
    ).first()
    if exists is None:
        quoted = connection.dialect.identifier_preparer.quote_schema(schema)
        connection.exec_driver_sql(f"CREATE SCHEMA {quoted}")
    if connection.dialect.name == "postgresql" and connection.get_transaction() is not None:
        # Outside the revisions' transactions (see locked_connection's per_revision).
        connection.commit()


def switch_to_wal(store: StoreCore) -> None:
    """Switch the SQLite file to WAL as zerda_store's schema is created in it (a file merely
    opened keeps its journal mode; WAL persists in the file). The switch needs a lock that
    SQLite does not wait for, so a process that creates the schema while another is
    switching or migrating it tries again for a while."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    with store.connect() as connection:
        driver = connection.connection.driver_connection
        assert driver is not None
        while True:
            try:
                if driver.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    driver.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@takes_store
def contract(store: StoreCore) -> list[str]:
    """The contract step of an upgrade: drop the defaults kept for servers of the previous
    release (``table.column`` of each dropped); refused at a revision other than head or
    while entities that ``db rekey`` would re-key remain (see :mod:`.contract`)."""
    from .contract import contract as drop_compatibility_defaults

    with _owner_only(store, "db contract"):
        return drop_compatibility_defaults(store, head_revision(), require_store_database(store))


@takes_store
def downgrade(store: StoreCore, revision: str) -> None:
    """Downgrade the schema to ``revision`` ("base" drops every table)."""
    from alembic import command

    with _owner_only(store, f"db downgrade {revision}"), locked_connection(store) as connection:
        from alembic.runtime.migration import MigrationContext

        refuse_interrupted_identity(
            connection, MigrationContext.configure(connection).get_current_revision()
        )
        command.downgrade(alembic_config(connection), revision)


def refuse_interrupted_identity(connection: Connection, current: str | None) -> None:
    """Refuse a downgrade of a database that an interrupted online revision 0006 left at
    0005 with some of its work committed (its tables, ``entities.core_key``, sessions
    re-keyed and merged): 0005's downgrade would leave all that to the older version."""
    if current != INTERRUPTED_IDENTITY_AT:
        return
    inspector = inspect(connection)
    columns = {column["name"] for column in inspector.get_columns("entities")}
    if inspector.has_table("entity_aliases") or "core_key" in columns:
        raise SchemaNotCurrentError(
            "revision 0006 was interrupted: run `zerda-store db upgrade` to finish it, "
            "then downgrade"
        )


@takes_store
def check(store: StoreCore) -> None:
    """Raise ``alembic.util.exc.AutogenerateDiffsDetected`` if the tables differ from the
    code. Only reads (a read-only store will do)."""
    from alembic import command

    with alembic_connection(store, locked=False) as connection:
        # Alembic prints its verdict on standard output; the caller says its own (`db
        # check --json` prints JSON only).
        command.check(alembic_config(connection, stdout=io.StringIO()))


@takes_store
def ensure_schema(store: StoreCore, auto_migrate: bool | None, *, create: bool = True) -> None:
    """Make sure the database holds zerda_store's schema at head, or at a newer release's
    revision at or above its compatibility floor (an expansion this version runs on,
    never migrated): upgrade one behind head (SQLite by default, never a read-only store)
    or say what to do. ``create=False`` never creates the schema in a database without one
    (an older zerda_store schema may still be upgraded)."""
    if store.schema_checked:
        return
    with store.schema_lock:
        if store.schema_checked:
            return
        asked = auto_migrate
        if store.read_only:
            auto_migrate = False
        elif auto_migrate is None:
            auto_migrate = store.dialect == "sqlite"
        found = survey(store)
        if found.revision is None:
            if found.taken_names:
                raise taken_names_error(store, found)
            # By default the schema is created only in an empty database: opening another
            # application's file does not change it.
            if not (auto_migrate and create) or (found.tables and asked is None):
                raise not_ours_error(store, found)
            upgrade(store)
        elif found.revision not in known_revisions():
            # A newer release's schema: run on it if it is an expansion (never migrate it).
            compatibility.require_runnable(store, found, known_revisions(), head_revision())
        elif found.revision != head_revision():
            if not auto_migrate:
                raise SchemaNotCurrentError(
                    f"the database schema of {store.safe_url} is at revision {found.revision}, "
                    f"this version of zerda_store needs {head_revision()}: run "
                    f"`{upgrade_command(store)}` first"
                )
            upgrade(store)
        store.schema_checked = True


@takes_store
def prepare_for_new_data(store: StoreCore) -> None:
    """For the commands that bring data in (``demo``, ``import``, ``copy``'s destination):
    create zerda_store's schema in an empty database on any backend, as ``db upgrade``
    would; otherwise as :func:`ensure_schema` with the backend's default (an older schema
    upgrades itself on SQLite only; a database holding other tables is refused)."""
    if not (store.schema_checked or store.read_only):
        found = survey(store)
        if found.revision is None and not found.tables and not found.elsewhere:
            upgrade(store)
    ensure_schema(store, auto_migrate=None)
