"""Fixtures of the command-line tests: a database (SQLite file or Postgres) holding the
sessions "acme", "globex" and "quiet", written through the Python API."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.cli.helpers import populate, url_maker
from tests.conftest import new_test_database
from zerda_store import Store, migrate


@pytest.fixture
def populated(database_url, make_memory) -> str:
    """A new database of the test's own, populated (for tests that change it)."""
    populate(make_memory)
    return database_url


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def shared_populated(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[str]:
    """One populated database per module and backend, for tests that only read it."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('shared') / 'memory.db'}"
        with Store(url) as store:
            migrate.upgrade(store)
        drop = None
    else:
        url, drop = new_test_database(request, at_head=True)
    try:
        populate(url_maker(url))
        yield url
    finally:
        if drop is not None:
            drop()


_suffixes = itertools.count(1)


@pytest.fixture
def own_sessions(shared_populated) -> tuple[str, str]:
    """The module's database and a suffix: "acme" + suffix etc. are this test's own sessions,
    written afresh (cheaper than a new Postgres database per test)."""
    suffix = f"-own-{next(_suffixes)}"
    populate(url_maker(shared_populated), suffix=suffix)
    return shared_populated, suffix
