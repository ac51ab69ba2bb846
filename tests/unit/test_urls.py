"""Database URLs as written by people: a password with unencoded "@" signs, a password in
the query, "@" in the database or the query; and how they are shown (no database needed)."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from zerda_store import ConversationEntityMemory, Store, StoreError
from zerda_store.db.connections.urls import resolve_url, safe_url
from zerda_store.db.store import core_of

PARSED = {
    # written: (username, password, host, port, database, query)
    "postgresql://app:p@ss@db.example:5433/crm": ("app", "p@ss", "db.example", 5433, "crm", {}),
    "postgresql://app:a@b@c@10.0.0.5/crm": ("app", "a@b@c", "10.0.0.5", None, "crm", {}),
    "postgresql://app:p@ss:w0rd@[::1]:5432/crm": ("app", "p@ss:w0rd", "::1", 5432, "crm", {}),
    "postgresql://app:p@ss@host/crm?application_name=bot@eu": (
        "app",
        "p@ss",
        "host",
        None,
        "crm",
        {"application_name": "bot@eu"},
    ),
    "postgresql://app@host:5432/crm?password=p@ss@w0rd": (
        "app",
        "p@ss@w0rd",
        "host",
        5432,
        "crm",
        {},
    ),
    "postgresql://host:5432/crm?application_name=bot@eu": (
        None,
        None,
        "host",
        5432,
        "crm",
        {"application_name": "bot@eu"},
    ),
    # What SQLAlchemy already read right stays as it was.
    "postgresql://app:pa/ss?w@host/crm": ("app", "pa/ss?w", "host", None, "crm", {}),
    "postgresql://app:2024/pa@host/crm": ("app", "2024/pa", "host", None, "crm", {}),
    "postgresql://app:p%40ss@host/crm": ("app", "p@ss", "host", None, "crm", {}),
    "postgresql://user@tenant@host:5432/crm": ("user@tenant", None, "host", 5432, "crm", {}),
    "postgresql://app:secret@host/my@db": ("app", "secret", "host", None, "my@db", {}),
    "sqlite:///data/a@b.db": (None, None, None, None, "data/a@b.db", {}),
}


@pytest.mark.parametrize("written", PARSED)
def test_the_userinfo_ends_at_the_last_at_sign_before_the_host(written: str) -> None:
    url = resolve_url(written)
    parts = (url.username, url.password, url.host, url.port, url.database, dict(url.query))
    assert parts == PARSED[written]


@pytest.mark.parametrize(
    "written",
    ["postgresql://app:p@ss@host:port/crm", "postgresql://app@host:port/crm?password=p@ss@w0rd"],
)
def test_a_port_that_is_not_a_number_is_refused_not_read_as_a_password(written: str) -> None:
    with pytest.raises(StoreError, match="could not parse") as raised:
        resolve_url(written)
    assert "ss" not in str(raised.value)


def test_a_password_in_the_query_is_shown_masked_like_any_password() -> None:
    url = resolve_url("postgresql://app@host/crm?password=Qp7zXk2Lm9Tv&application_name=bot")
    assert url.password == "Qp7zXk2Lm9Tv"
    assert safe_url(url) == "postgresql+psycopg://app:***@host/crm?application_name=bot"


def test_secret_query_values_are_masked_and_the_others_shown() -> None:
    url = resolve_url(
        "postgresql://app:pw1234@host/crm?sslpassword=k3y&api_token=t0k"
        "&client_secret=s3c&application_name=bot&password=second"
    )
    shown = safe_url(url)
    assert shown.startswith("postgresql+psycopg://app:***@host/crm?")
    assert "application_name=bot" in shown
    for key in ("api_token", "client_secret", "sslpassword"):
        assert f"{key}=***" in shown
    for secret in ("pw1234", "k3y", "t0k", "s3c", "second"):
        assert secret not in shown


def test_a_sqlite_url_shows_no_password_from_its_query(tmp_path: Path) -> None:
    url = resolve_url(f"sqlite:///{tmp_path}/memory.db?password=Qp7zXk2Lm9Tv")
    assert safe_url(url).endswith("memory.db?password=***")


@pytest.mark.parametrize(
    "written",
    [
        "postgresql://app:Hx4@pw7Qz@rT9 +x@127.0.0.1/crm",
        "postgresql://app@127.0.0.1/crm?password=Hx4%40pw7Qz%40rT9%20%2Bx",
        "postgresql://app:other@127.0.0.1/crm?sslpassword=Hx4%40pw7Qz%40rT9%20%2Bx",
    ],
)
def test_a_driver_message_is_shown_without_any_form_of_a_secret(written: str) -> None:
    secret = "Hx4@pw7Qz@rT9 +x"
    forms = [secret, quote(secret, safe=""), quote(secret, safe=" +"), quote_plus(secret)]
    with Store(written) as store:
        shown = core_of(store).describe(
            RuntimeError("driver said: " + " | ".join(forms) + "\nmore")
        )
        assert shown == "driver said: " + " | ".join(["***"] * len(forms))
        assert not any(form in repr(store) for form in forms)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused_with_a_clear_error(url):
    with pytest.raises(StoreError, match="in-memory SQLite") as caught:
        Store(url)
    assert "use a file" in str(caught.value)

    with pytest.raises(StoreError, match="use a file"):
        ConversationEntityMemory(database_url=url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://u:s3cret@db.example/crm", "unsupported database 'mysql'"),
        ("postgresql+psycopg2://u:s3cret@db.example/crm", "the psycopg2 driver is not supported"),
        ("postgresql://u:s3cret@db.example:abc/crm", "could not parse the database URL"),
    ],
)
def test_an_unsupported_or_malformed_url_is_a_store_error_without_the_password(url, expected):
    with pytest.raises(StoreError) as caught:
        Store(url)

    error = caught.value
    assert expected in str(error)
    assert "s3cret" not in str(error)
    assert "s3cret" not in repr(error)
    assert "s3cret" not in "".join(traceback.format_exception(error))


def test_a_non_numeric_port_is_refused_before_any_connection_is_tried():
    with pytest.raises(StoreError, match="could not parse"):
        ConversationEntityMemory(database_url="postgresql://u:pw@127.0.0.1:abc/crm")


def test_a_postgres_url_without_psycopg_names_the_extra_to_install(monkeypatch):
    for module in [m for m in sys.modules if m == "psycopg" or m.startswith("psycopg.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError

    with pytest.raises(StoreError) as refused:
        Store("postgresql://app:secret@db.example/crm")

    message = str(refused.value)
    assert "psycopg" in message
    assert "pip install '.[postgres]' in a checkout" in message
    assert "py3-none-any.whl[postgres]'" in message  # the wheel's form too
    assert "secret" not in message


@pytest.mark.parametrize(
    "options",
    [
        "-c x.pw=Zq81vB",
        "-cx.pw=Zq81vB -c search_path=zerda",
        "--app.password=Zq81vB",
        "-c a.token=Zq81vB",
    ],
)
def test_a_secret_setting_inside_options_is_masked_and_the_others_shown(options: str) -> None:
    written = f"postgresql://app@127.0.0.1/crm?options={quote(options, safe='')}"
    url = resolve_url(written)
    shown = safe_url(url)
    assert "Zq81vB" not in shown and "***" in shown
    if "search_path" in options:
        assert "search_path" in shown and "zerda" in shown
    with Store(written) as store:
        said = core_of(store).describe(RuntimeError(f"driver said: Zq81vB / {quote('Zq81vB')}"))
        assert "Zq81vB" not in said and "Zq81vB" not in repr(store)
