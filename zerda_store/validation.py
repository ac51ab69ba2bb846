"""Checks on what callers pass in: text every backend can store, identifiers, names and
numbers within the schema's limits. Refusals are TypeError/ValueError naming the argument
(``errors.RefusedTypeError`` and ``RefusedValueError``: the command line exits 2 on them),
raised before anything is written, the same on every backend (docs/hardening.md lists
every rule)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import TypeGuard

from .db.schema import entities, max_integer, max_length, retention_policies, turns
from .errors import RefusedTypeError, RefusedValueError
from .model.names import is_acceptable_name

MAX_SESSION_ID_LENGTH = max_length(turns.c.session_id) or 255
MAX_IDEMPOTENCY_KEY_LENGTH = max_length(turns.c.idempotency_key) or 255
MAX_NAME_LENGTH = max_length(entities.c.name) or 256
MAX_TYPE_LENGTH = max_length(entities.c.entity_type) or 64
MAX_COUNT = max_integer(retention_policies.c.keep_last)
MAX_ID = max_integer(entities.c.id)
# The longest duration a policy takes: from the epoch to the end of year 9999, the range
# of every stored time (an export's times are checked against the same bound).
MAX_SECONDS = 253_402_300_799.0
# The longest text of a turn's input or output, or of a snippet, in characters (code
# points): about 1 MB of text, 4 MB at most in UTF-8. A 50 MB message added about 300 MB
# to its save and its recall returned 105 MB; a chat turn is a few kilobytes.
MAX_TEXT_LENGTH = 1_000_000


def checked_text(value: object, what: str) -> str:
    """A value that can be stored as text on every backend, at most ``MAX_TEXT_LENGTH``
    characters long, else TypeError/ValueError."""
    if _is_plain(value):
        return _within_limit(value, what)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RefusedTypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise RefusedValueError(f"{what} contains a NUL character, which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RefusedValueError(
            f"{what} is not valid Unicode text (it holds a lone surrogate)"
        ) from None
    return _within_limit(value, what)


def _within_limit(value: str, what: str) -> str:
    if len(value) > MAX_TEXT_LENGTH:
        raise RefusedValueError(
            f"{what} is {len(value):,} characters long; the limit is {MAX_TEXT_LENGTH:,} "
            "(about 1 MB of text)"
        )
    return value


def mapping_text(mapping: object, key: str, argument: str) -> str:
    if not isinstance(mapping, Mapping):
        raise RefusedTypeError(
            f"{argument} must be a mapping such as a dict, not {type(mapping).__name__}"
        )
    value = mapping.get(key)
    if _is_plain(value) and len(value) <= MAX_TEXT_LENGTH:
        return value  # every turn's case, passed without naming the argument
    return checked_text(value, f"{argument}[{key!r}]")


def _is_plain(value: object) -> TypeGuard[str]:
    """A str of ASCII without NUL: storable, known without reading it for surrogates."""
    return type(value) is str and value.isascii() and "\x00" not in value


def checked_session_id(value: object) -> str:
    """A valid session id (1 to 255 characters of storable text), else ValueError/TypeError."""
    return checked_identifier(value, "session_id")


def checked_identifier(value: object, what: str, limit: int = MAX_SESSION_ID_LENGTH) -> str:
    text = checked_text(value, what)
    if not 1 <= len(text) <= limit:
        raise RefusedValueError(f"{what} must be 1 to {limit} characters long")
    return text


def checked_name(value: object, what: str, limit: int = MAX_NAME_LENGTH) -> str:
    """A name every table and every path (export, import, copy) can store: 1 to ``limit``
    characters, no control characters; else TypeError/ValueError."""
    if not isinstance(value, str):
        raise RefusedTypeError(f"{what} must be a str, not {type(value).__name__}")
    if not is_acceptable_name(value, limit):
        raise RefusedValueError(
            f"{what} must be 1 to {limit} characters without control characters, got "
            f"{_shown(value)}"
        )
    return value


def checked_entity_type(value: object, what: str = "entity_type") -> str:
    """An entity type as the schema stores it (1 to 64 characters, no control characters)."""
    return checked_name(value, what, MAX_TYPE_LENGTH)


def checked_whole_number(
    value: object, what: str, low: int, high: int, error: type[ValueError] = RefusedValueError
) -> int:
    """An int (not a bool) from ``low`` to ``high``; else ``error`` (a ValueError)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{what} must be a whole number from {low:,} to {high:,}, got {_shown(value)}")
    return value


def checked_seconds(value: object, what: str) -> float:
    """A duration (timedelta or a number of seconds, not a bool) as positive seconds, at
    most ``MAX_SECONDS``; else ValueError."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        # A comparison, not float(): an int of 400 digits has no float.
        seconds = float(value) if -MAX_SECONDS <= value <= MAX_SECONDS else math.nan
    else:
        seconds = math.nan
    if not 0 < seconds <= MAX_SECONDS:
        raise RefusedValueError(
            f"{what} must be a positive duration (a timedelta or seconds, at most "
            f"{MAX_SECONDS:,.0f}), got {_shown(value)}"
        )
    return seconds


def _shown(value: object) -> str:
    """A refused value as a message shows it: on one line, never thousands of characters."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
