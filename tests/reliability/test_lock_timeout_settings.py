"""How the store sets Postgres's lock_timeout: never 0 (which means no limit), and without
overriding the URL's options or PGOPTIONS."""

from __future__ import annotations

import pytest

from zerda_store import Store

pytestmark = pytest.mark.postgres


def _show(store: Store, setting: str) -> str:
    with store.connect() as connection:
        return str(connection.exec_driver_sql(f"SHOW {setting}").scalar_one())


def test_a_tiny_lock_timeout_is_a_millisecond_not_unlimited(postgres_url):
    with Store(postgres_url, lock_timeout=0.0004) as store:
        assert _show(store, "lock_timeout") == "1ms"


def test_the_urls_options_are_kept(postgres_url):
    with Store(postgres_url + "?options=-c%20statement_timeout%3D4321", lock_timeout=2) as store:
        assert (_show(store, "statement_timeout"), _show(store, "lock_timeout")) == ("4321ms", "2s")


def test_pgoptions_from_the_environment_are_kept(postgres_url, monkeypatch):
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=4321")
    with Store(postgres_url) as store:
        assert (_show(store, "statement_timeout"), _show(store, "lock_timeout")) == ("4321ms", "5s")


@pytest.mark.parametrize("value", [0, -1, float("nan")])
def test_a_lock_timeout_that_is_not_positive_is_refused(postgres_url, value):
    with pytest.raises(ValueError, match="lock_timeout"):
        Store(postgres_url, lock_timeout=value)
