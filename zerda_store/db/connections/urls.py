"""Database URLs as people write them, and as zerda_store shows them.

A password may come in the userinfo (``user:password@host``, with or without percent-encoding
of its ``@`` signs) or in the query (``?password=...``, which libpq and psycopg accept). Every
message and log line shows the URL through :func:`safe_url` and driver text through
:func:`scrub`, so that no form of a password is ever shown.

A Postgres URL may name several servers, as libpq's do
(``postgresql://app@h1:5432,h2:5433/crm?target_session_attrs=read-write``): the driver tries
them in turn and, with ``target_session_attrs=read-write``, keeps the one that accepts writes,
which is how an application follows a failover. SQLAlchemy reads such a list from the query
only (``?host=h1,h2&port=5432,5433``), so :func:`parse_url` moves it there, and
:func:`safe_url` shows it as written.
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote, quote_plus

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from ...errors import DatabaseUrlError

MASK = "***"
DEFAULT_DATABASE_URL = "sqlite:///zerda_store.db"
DATABASE_URL_ENV = "ZERDA_STORE_DATABASE_URL"

# A query key whose value is a secret: password, sslpassword, and the like.
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|credential|(?<![a-z])pw(?![a-z])", re.IGNORECASE)
# A setting inside libpq's ``options=`` (``-c name=value``, ``-cname=value``,
# ``--name=value``): a secret-looking name's value is a secret too.
_OPTION_SETTING = re.compile(r"(?:-c\s*|--)([A-Za-z0-9_.\-]+)=((?:\\.|\S)*)")

# Where the database is: a host (or [IPv6 address]) holding no "@", a port, then an optional
# database and query. In a URL without userinfo the port must be a number and an "@" may
# only be in the query (else "user:2024/pa@host" would be the host "user" on port 2024);
# after userinfo the port may be anything, so that a bad port is reported as one rather than
# taken for part of the password.
# A list of hosts is separated by commas, each host with its own optional port.
_HOST = r"(?:\[[^\]]*\]|[^@/?:,\[\]]*)"
_HOSTS = rf"{_HOST}(?::\d*)?(?:,{_HOST}(?::\d*)?)*"
_HOSTS_AFTER_USERINFO = rf"{_HOST}(?::[^@/?,]*)?(?:,{_HOST}(?::[^@/?,]*)?)*"
_LOCATION = re.compile(rf"{_HOSTS}(?:/[^?@]*)?(?:\?.*)?", re.DOTALL)
_LOCATION_AFTER_USERINFO = re.compile(rf"{_HOSTS_AFTER_USERINFO}(?:/[^?]*)?(?:\?.*)?", re.DOTALL)
# One host of a list: a name or [IPv6 address], and its port.
_HOST_PORT = re.compile(r"(\[[^\]]*\]|[^:]*)(?::(.*))?", re.DOTALL)
# user[:password]: the user holds no ":" or "/", the password anything.
_USERINFO = re.compile(r"[^:/]*(?::.*)?", re.DOTALL)


def parse_url(text: str) -> URL:
    """``text`` as a SQLAlchemy URL. The userinfo ends at the last ``@`` before the host, so
    a password may hold unencoded ``@`` signs (SQLAlchemy alone ends it at the first one and
    takes the rest for the host), and an ``@`` in the database or the query is left there.
    A list of hosts (``h1:5432,h2:5433``) goes to the query, where SQLAlchemy reads it."""
    scheme, separator, rest = text.partition("://")
    split = _split_userinfo(rest) if separator else None
    if split is not None:
        userinfo, location = split
        # Encoded, every "@" but the userinfo's end is data to SQLAlchemy, which decodes it.
        prefix = "" if userinfo is None else userinfo.replace("@", "%40") + "@"
        text = f"{scheme}://{prefix}{_hosts_to_query(location).replace('@', '%40')}"
    return make_url(text)


def _hosts_to_query(location: str) -> str:
    """``location`` (hosts, database, query) with a list of several hosts moved into the
    query as ``host=h1,h2&port=p1,p2`` (an IPv6 address loses its brackets there; a host
    without a port gets the empty one, the driver's default). One host stays where it is."""
    end = min((i for i in (location.find("/"), location.find("?")) if i >= 0), default=None)
    hosts, rest = location[:end], location[len(location) if end is None else end :]
    if "," not in hosts:
        return location
    pairs = [_HOST_PORT.fullmatch(host) for host in hosts.split(",")]
    names = ",".join(pair.group(1).strip("[]") for pair in pairs if pair is not None)
    ports = ",".join(pair.group(2) or "" for pair in pairs if pair is not None)
    database, _, query = rest.partition("?")
    listed = f"host={quote(names, safe='')}"
    if ports.strip(","):
        listed += f"&port={quote(ports, safe='')}"
    return f"{database}?{listed}" + (f"&{query}" if query else "")


def _split_userinfo(rest: str) -> tuple[str | None, str] | None:
    """``rest`` (the URL after ``scheme://``) as userinfo (None if there is none) and
    location; None if it fits neither."""
    if _LOCATION.fullmatch(rest):
        return None, rest
    for at in (index for index, char in enumerate(rest) if char == "@"):
        userinfo, location = rest[:at], rest[at + 1 :]
        if _USERINFO.fullmatch(userinfo) and _LOCATION_AFTER_USERINFO.fullmatch(location):
            return userinfo, location
    return None


def is_secret_key(key: str) -> bool:
    """Whether a query key's value is a secret (``password``, ``sslpassword``, ...)."""
    return _SECRET_KEY.search(key) is not None


def _option_secrets(options: str) -> list[str]:
    """The values of the secret-looking settings of an ``options=`` value."""
    return [
        found.group(2)
        for found in _OPTION_SETTING.finditer(options)
        if is_secret_key(found.group(1)) and found.group(2)
    ]


def _masked_options(options: str) -> str:
    """An ``options=`` value with its secret settings' values masked."""

    def masked(found: re.Match[str]) -> str:
        if not is_secret_key(found.group(1)) or not found.group(2):
            return found.group(0)
        return found.group(0)[: found.start(2) - found.start(0)] + MASK

    return _OPTION_SETTING.sub(masked, options)


def _shown_value(key: str, value: str) -> str:
    if is_secret_key(key):
        return MASK
    if key == "options":
        return quote_plus(_masked_options(value)).replace(quote_plus(MASK), MASK)
    return quote_plus(value)


def secret_query(url: URL) -> dict[str, str | tuple[str, ...]]:
    """The query items of ``url`` that hold secrets."""
    return {key: value for key, value in url.query.items() if is_secret_key(key)}


def with_password_from_query(url: URL) -> URL:
    """``?password=`` moved into the URL's password (psycopg lets the query's win anyway),
    where SQLAlchemy masks it in its own reprs and logs."""
    password = url.query.get("password")
    if not isinstance(password, str):
        return url
    return url.difference_update_query(["password"]).set(password=password)


def safe_url(url: URL) -> str:
    """The URL as text with its password and every secret query value masked; a list of
    hosts is shown where libpq's URLs have it (``app:***@h1:5432,h2:5433/db``)."""
    hosts = host_list(url)
    query = dict(url.query)
    if hosts is not None:
        query = {key: value for key, value in query.items() if key not in ("host", "port")}
    shown = url.set(query={}).render_as_string(hide_password=True)
    if hosts is not None:
        scheme, _, rest = shown.partition("://")
        slash = rest.find("/")
        at = len(rest) if slash < 0 else slash
        shown = f"{scheme}://{rest[:at]}{','.join(hosts)}{rest[at:]}"
    items = [
        f"{quote_plus(key)}={_shown_value(key, value)}"
        for key in sorted(query)
        for value in _values(query[key])
    ]
    return f"{shown}?{'&'.join(items)}" if items else shown


def host_list(url: URL) -> list[str] | None:
    """The servers of a URL that names them in its query (``?host=h1,h2&port=p1,p2``, or
    ``?host=h1:p1&host=h2:p2``) as ``host:port`` (an IPv6 address in brackets), in the order
    the driver tries them; None when the URL names its host the usual way, or one socket
    folder."""
    if url.host is not None or "host" not in url.query:
        return None
    hosts = [h for value in _values(url.query["host"]) for h in value.split(",")]
    ports = [p for value in _values(url.query.get("port", ())) for p in value.split(",")]
    if len(hosts) < 2 and not ports and ":" not in hosts[0]:
        return None
    shown = [f"[{h}]" if h.count(":") > 1 else h for h in hosts]
    if ports:
        return [f"{h}:{p}" if p else h for h, p in zip(shown, ports, strict=False)]
    return shown


def secrets(url: URL) -> list[str]:
    """Every secret ``url`` holds: its password, its secret query values and the secret
    settings inside ``options=``."""
    found = [str(url.password)] if url.password else []
    for value in secret_query(url).values():
        found += [item for item in _values(value) if item]
    for options in _values(url.query.get("options", ())):
        found += _option_secrets(options)
    return found


def scrub(text: str, url: URL) -> str:
    """``text`` with every secret of ``url`` masked, raw or percent-encoded."""
    forms = {
        form
        for secret in secrets(url)
        for form in (secret, quote(secret, safe=""), quote(secret, safe=" +"), quote_plus(secret))
    }
    for form in sorted(forms, key=len, reverse=True):  # "p%40ss" before a "p" inside it
        text = text.replace(form, MASK)
    return text


def _values(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def resolve_url(database_url: str | URL | None = None) -> URL:
    """The URL to use: the argument, else ``ZERDA_STORE_DATABASE_URL``, else the SQLite file.

    ``postgresql://`` and ``postgres://`` URLs are mapped to the psycopg 3 driver. A password
    may hold unencoded ``@`` signs, or come as ``?password=`` (it then becomes the URL's
    password, which is never shown).
    """
    raw = database_url or os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL
    if isinstance(raw, str) and raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://") :]
    try:
        url = parse_url(raw) if isinstance(raw, str) else raw
        url.port  # noqa: B018  (a port that is not a number is found here, not later)
    except (ArgumentError, ValueError):
        raise DatabaseUrlError(
            "could not parse the database URL; expected e.g. sqlite:///file.db "
            "or postgresql://user@host/dbname"
        ) from None
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "postgresql":
        url = with_password_from_query(url)
    return url
