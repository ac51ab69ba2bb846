"""Throwaway databases for the benchmarks: SQLite files in a temporary folder, Postgres
schemas in one database named ``zerda_bench_<random>``, all at zerda_store's head revision
and all removed at the end.

Both zerda_store and the raw-driver floors run on the tables that
``zerda_store.db.migration.migrate.upgrade`` creates, so they share every table and index.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field

import sqlalchemy as sa

from zerda_store import Store, migrate

POSTGRES_ADMIN_URL = os.environ.get(
    "ZERDA_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@dataclass
class Database:
    """One benchmark database: its SQLAlchemy URL for zerda_store and the address the raw
    driver opens (a file path for SQLite, a libpq conninfo string for Postgres)."""

    backend: str
    url: str
    address: str
    tables: frozenset[str] = field(default_factory=frozenset)

    @property
    def has_ledger(self) -> bool:
        """Whether the schema has the per-turn extraction ledger (revision 0002 on)."""
        return "extractions" in self.tables


class Databases:
    """Makes databases of one backend and removes them all on :meth:`close`."""

    def __init__(self, backend: str, folder: str | None = None) -> None:
        self.backend = backend
        self.folder = tempfile.mkdtemp(prefix="zerda_bench_", dir=folder)
        self._postgres_names: list[str] = []
        self._made: dict[str, Database] = {}
        self._admin: sa.Engine | None = None
        if backend == "postgres":
            self._admin = sa.create_engine(
                POSTGRES_ADMIN_URL,
                isolation_level="AUTOCOMMIT",
                connect_args={"connect_timeout": 5},
            )

    def __enter__(self) -> Databases:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def get(self, label: str) -> Database:
        """The database called ``label``, made on first use; sections share databases
        (each works in its own sessions) because making one costs a second on Postgres."""
        if label not in self._made:
            self._made[label] = self.new(label)
        return self._made[label]

    def new(self, label: str) -> Database:
        """A new database at head revision."""
        if self.backend == "sqlite":
            path = os.path.join(self.folder, f"{label}.db")
            database = Database("sqlite", f"sqlite:///{path}", path)
        else:
            database = self._new_postgres(label)
        with Store(database.url) as store:
            migrate.upgrade(store)
            database.tables = frozenset(sa.inspect(store.engine).get_table_names())
        return database

    def _new_postgres(self, label: str) -> Database:
        # One database per run, one schema per label (found through search_path): making a
        # schema is instant, making a database copies a template and costs a second.
        assert self._admin is not None
        if not self._postgres_names:
            name = f"zerda_bench_{uuid.uuid4().hex[:12]}"
            with self._admin.connect() as connection:
                connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
            self._postgres_names.append(name)
        url = sa.make_url(POSTGRES_ADMIN_URL).set(
            database=self._postgres_names[0], query={"options": f"-csearch_path={label}"}
        )
        engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(f'CREATE SCHEMA "{label}"')
        finally:
            engine.dispose()
        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        return Database("postgres", url.render_as_string(hide_password=False), conninfo)

    def server_version(self) -> str | None:
        if self._admin is None:
            return None
        with self._admin.connect() as connection:
            return str(connection.exec_driver_sql("SHOW server_version").scalar())

    def close(self) -> None:
        if self._admin is not None:
            with self._admin.connect() as connection:
                for name in self._postgres_names:
                    connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self._postgres_names.clear()
            self._admin.dispose()
        shutil.rmtree(self.folder, ignore_errors=True)


def postgres_available() -> str | None:
    """None if the benchmark Postgres server answers, else why not."""
    engine = sa.create_engine(POSTGRES_ADMIN_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            return None
    except sa.exc.OperationalError as exc:
        return str(exc.orig).strip().splitlines()[0]
    finally:
        engine.dispose()
