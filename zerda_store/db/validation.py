"""Checks on what callers pass in: text every backend can store, and identifiers within
the schema's limits. Refusals are TypeError/ValueError naming the argument."""

from __future__ import annotations

from collections.abc import Mapping

from .schema import max_length, turns

MAX_SESSION_ID_LENGTH = max_length(turns.c.session_id) or 255
MAX_IDEMPOTENCY_KEY_LENGTH = max_length(turns.c.idempotency_key) or 255


def checked_text(value: object, what: str) -> str:
    """A value that can be stored as text on every backend, else TypeError/ValueError."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL character, which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode text (it holds a lone surrogate)") from None
    return value


def mapping_text(mapping: object, key: str, argument: str) -> str:
    if not isinstance(mapping, Mapping):
        raise TypeError(
            f"{argument} must be a mapping such as a dict, not {type(mapping).__name__}"
        )
    return checked_text(mapping.get(key), f"{argument}[{key!r}]")


def checked_session_id(value: object) -> str:
    """A valid session id (1 to 255 characters of storable text), else ValueError/TypeError."""
    return checked_identifier(value, "session_id")


def checked_identifier(value: object, what: str, limit: int = MAX_SESSION_ID_LENGTH) -> str:
    text = checked_text(value, what)
    if not 1 <= len(text) <= limit:
        raise ValueError(f"{what} must be 1 to {limit} characters long")
    return text
