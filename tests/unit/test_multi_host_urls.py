"""URLs that name several Postgres servers, as libpq's do
(``postgresql://app@h1:5432,h2:5433/crm?target_session_attrs=read-write``): how they are read,
what the driver is given, and how they are shown (no database needed)."""

from __future__ import annotations

import pytest

from tests.cli.helpers import invoke, one_line_error
from zerda_store import Store, StoreError
from zerda_store.db.connections.settings import engine_options
from zerda_store.db.connections.urls import resolve_url, safe_url

FAILOVER = (
    "postgresql://app:pw@db1.internal:5432,db2.internal:5433/crm?target_session_attrs=read-write"
)

READ = {
    # written: (username, password, database, host and port in the query, other query items)
    FAILOVER: (
        "app",
        "pw",
        "crm",
        {"host": "db1.internal,db2.internal", "port": "5432,5433"},
        {"target_session_attrs": "read-write"},
    ),
    "postgresql://h1:5432,h2:5433/crm": (
        None,
        None,
        "crm",
        {"host": "h1,h2", "port": "5432,5433"},
        {},
    ),
    # Unencoded "@" signs in the password; a host without a port takes the default.
    "postgresql://app:p@ss@w0rd@h1,h2:6432/crm": (
        "app",
        "p@ss@w0rd",
        "crm",
        {"host": "h1,h2", "port": ",6432"},
        {},
    ),
    "postgresql://app@h1,h2/crm?password=p@ss&target_session_attrs=primary": (
        "app",
        "p@ss",
        "crm",
        {"host": "h1,h2"},
        {"target_session_attrs": "primary"},
    ),
    "postgresql://app:pw@[::1]:5432,[fe80::7]:5433/crm": (
        "app",
        "pw",
        "crm",
        {"host": "::1,fe80::7", "port": "5432,5433"},
        {},
    ),
}


@pytest.mark.parametrize("written", READ)
def test_a_list_of_hosts_is_read_into_the_query_where_sqlalchemy_reads_it(written: str) -> None:
    url = resolve_url(written)
    user, password, database, hosts, others = READ[written]
    assert (url.username, url.password, url.host, url.port, url.database) == (
        user,
        password,
        None,
        None,
        database,
    )
    assert dict(url.query) == {**hosts, **others}


def test_the_driver_gets_every_host_with_its_port_and_the_session_attributes() -> None:
    with Store(FAILOVER) as store:
        _, arguments = store.engine.dialect.create_connect_args(store.engine.url)
    assert arguments["host"] == "db1.internal,db2.internal"
    assert arguments["port"] == "5432,5433"
    assert arguments["target_session_attrs"] == "read-write"
    assert (arguments["user"], arguments["password"], arguments["dbname"]) == ("app", "pw", "crm")


def test_the_connection_settings_keep_the_hosts_and_add_the_timeouts() -> None:
    url, options = engine_options(resolve_url(FAILOVER + "&sslpassword=k3y"), 5.0, None)
    assert dict(url.query) == {
        "host": "db1.internal,db2.internal",
        "port": "5432,5433",
        "target_session_attrs": "read-write",
    }
    assert options["connect_args"]["sslpassword"] == "k3y"
    assert options["connect_args"]["connect_timeout"] == 5


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        (
            FAILOVER,
            "postgresql+psycopg://app:***@db1.internal:5432,db2.internal:5433/crm"
            "?target_session_attrs=read-write",
        ),
        (
            "postgresql://app:p@ss@w0rd@h1,h2:6432/crm?password=other",
            "postgresql+psycopg://app:***@h1,h2:6432/crm",
        ),
        ("postgresql://h1:5432,h2:5433/crm", "postgresql+psycopg://h1:5432,h2:5433/crm"),
        (
            "postgresql://app:pw@[::1]:5432,[fe80::7]/crm",
            "postgresql+psycopg://app:***@[::1]:5432,[fe80::7]/crm",
        ),
        # SQLAlchemy's own form of a list is shown the same way.
        (
            "postgresql://app:pw@/crm?host=h1:5432&host=h2:5433",
            "postgresql+psycopg://app:***@h1:5432,h2:5433/crm",
        ),
        # One socket folder in the query is not a list.
        (
            "postgresql://app@/crm?host=/var/run/postgresql",
            "postgresql+psycopg://app@/crm?host=%2Fvar%2Frun%2Fpostgresql",
        ),
    ],
)
def test_a_list_of_hosts_is_shown_as_written_with_the_password_masked(
    written: str, shown: str
) -> None:
    assert safe_url(resolve_url(written)) == shown
    with Store(written) as store:
        assert repr(store) == f"Store({shown!r})"


def test_one_host_is_left_where_it_was_written() -> None:
    url = resolve_url("postgresql://app:pw@db.internal:5432/crm?target_session_attrs=read-write")
    assert (url.host, url.port, dict(url.query)) == (
        "db.internal",
        5432,
        {"target_session_attrs": "read-write"},
    )


def test_a_port_of_a_listed_host_that_is_not_a_number_is_refused_without_the_password() -> None:
    with pytest.raises(StoreError, match="non-integer port") as raised:
        Store("postgresql://app:Qp7zXk2Lm9Tv@h1:5432,h2:x/crm")
    assert "Qp7zXk2Lm9Tv" not in str(raised.value)
    assert "app:***@h1:5432,h2:x/crm" in str(raised.value)


def test_the_command_line_takes_a_list_of_hosts_and_names_them_when_none_answers() -> None:
    # Two closed ports on this machine: the error names both, never the password.
    written = (
        "postgresql://app:Qp7zXk2Lm9Tv@127.0.0.1:1,127.0.0.1:2/crm?target_session_attrs=read-write"
    )
    line = one_line_error(invoke(written, "db", "current"))
    assert "cannot connect to postgresql+psycopg://app:***@127.0.0.1:1,127.0.0.1:2/crm" in line
    assert "Qp7zXk2Lm9Tv" not in line
