"""Fixtures for pytest-alembic.

Its built-in tests take one ``alembic_engine`` per run (a parametrized one is rejected),
so the backend comes from ``ZERDA_TEST_ALEMBIC_BACKEND`` (``sqlite``, the default, or
``postgres``) and CI runs the suite once per backend:

    ZERDA_TEST_ALEMBIC_BACKEND=sqlite   pytest tests/migrations --test-alembic \\
        --alembic-tests-path tests/migrations/conftest.py
    ZERDA_TEST_ALEMBIC_BACKEND=postgres pytest tests/migrations --test-alembic \\
        --alembic-tests-path tests/migrations/conftest.py

pytest-alembic hands whatever ``alembic_engine`` yields to ``env.py`` as
``config.attributes["connection"]``, and ``env.py`` passes it to
``context.configure(connection=...)``, which only takes a ``Connection``: so the fixture
yields a connection of a zerda_store engine (the same pragmas and begin events as the
library), not an engine.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.config import Config

from zerda_store import Store, migrate

BACKEND = os.environ.get("ZERDA_TEST_ALEMBIC_BACKEND", "sqlite")
BACKENDS = ("sqlite", "postgres")


@pytest.fixture
def alembic_config() -> Config:
    return migrate.alembic_config()


@pytest.fixture
def alembic_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new, empty database on the backend chosen by ``ZERDA_TEST_ALEMBIC_BACKEND``."""
    if BACKEND not in BACKENDS:
        raise pytest.UsageError(f"ZERDA_TEST_ALEMBIC_BACKEND must be one of {BACKENDS}")
    if BACKEND == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrations.db'}"
        return
    admin: sa.Engine = request.getfixturevalue("postgres_admin")
    name = f"zerda_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(str(admin.url)).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def alembic_engine(alembic_database_url: str) -> Iterator[sa.Connection]:
    with Store(alembic_database_url) as store, store.connect() as connection:
        if store.dialect == "sqlite":
            # As migrate.locked_connection does: batch migrations copy tables, which
            # SQLite allows only with foreign keys off (set outside any transaction).
            connection.connection.driver_connection.execute(  # type: ignore[union-attr]
                "PRAGMA foreign_keys=OFF"
            )
        yield connection
