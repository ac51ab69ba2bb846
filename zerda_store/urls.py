"""Database URLs as people write them, and as zerda_store shows them.

A password may come in the userinfo (``user:password@host``, with or without percent-encoding
of its ``@`` signs) or in the query (``?password=...``, which libpq and psycopg accept). Every
message and log line shows the URL through :func:`safe_url` and driver text through
:func:`scrub`, so that no form of a password is ever shown.
"""

from __future__ import annotations

import re
from urllib.parse import quote, quote_plus

from sqlalchemy.engine import URL, make_url

MASK = "***"

# A query key whose value is a secret: password, sslpassword, and the like.
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|credential", re.IGNORECASE)

# Where the database is: a host (or [IPv6 address]) holding no "@", a port, then an optional
# database and query. In a URL without userinfo the port must be a number and an "@" may
# only be in the query (else "user:2024/pa@host" would be the host "user" on port 2024);
# after userinfo the port may be anything, so that a bad port is reported as one rather than
# taken for part of the password.
_HOST = r"(?:\[[^\]]*\]|[^@/?:\[\]]*)"
_LOCATION = re.compile(rf"{_HOST}(?::\d*)?(?:/[^?@]*)?(?:\?.*)?", re.DOTALL)
_LOCATION_AFTER_USERINFO = re.compile(rf"{_HOST}(?::[^@/?]*)?(?:/[^?]*)?(?:\?.*)?", re.DOTALL)
# user[:password]: the user holds no ":" or "/", the password anything.
_USERINFO = re.compile(r"[^:/]*(?::.*)?", re.DOTALL)


def parse_url(text: str) -> URL:
    """``text`` as a SQLAlchemy URL. The userinfo ends at the last ``@`` before the host, so
    a password may hold unencoded ``@`` signs (SQLAlchemy alone ends it at the first one and
    takes the rest for the host), and an ``@`` in the database or the query is left there."""
    scheme, separator, rest = text.partition("://")
    split = _split_userinfo(rest) if separator else None
    if split is not None:
        userinfo, location = split
        # Encoded, every "@" but the userinfo's end is data to SQLAlchemy, which decodes it.
        prefix = "" if userinfo is None else userinfo.replace("@", "%40") + "@"
        text = f"{scheme}://{prefix}{location.replace('@', '%40')}"
    return make_url(text)


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
    """The URL as text with its password and every secret query value masked."""
    shown = url.set(query={}).render_as_string(hide_password=True)
    items = [
        f"{quote_plus(key)}={MASK if is_secret_key(key) else quote_plus(value)}"
        for key in sorted(url.query)
        for value in _values(url.query[key])
    ]
    return f"{shown}?{'&'.join(items)}" if items else shown


def secrets(url: URL) -> list[str]:
    """Every secret ``url`` holds: its password and its secret query values."""
    found = [str(url.password)] if url.password else []
    for value in secret_query(url).values():
        found += [item for item in _values(value) if item]
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
