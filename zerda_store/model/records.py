"""The small records the repository speaks in: plain values, no database types."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .names import UNKNOWN_TYPE

# The records below are built on every turn: named tuples, which are immutable and cost
# a third of a frozen dataclass to make.


def turn_text(input_text: str, output_text: str) -> str:
    """A turn as one text, as the original extracts from and stores it: input, space, output."""
    return f"{input_text} {output_text}"


class Mention(NamedTuple):
    """An entity named in a turn: the name as extracted, its key and its type."""

    name: str
    key: str
    entity_type: str = UNKNOWN_TYPE
    # The key without titles and legal suffixes, and what was stripped (``identity.py``).
    core: str = ""
    markers: frozenset[tuple[str, str]] = frozenset()

    @property
    def core_key(self) -> str:
        return self.core or self.key


# Mentions' keys and core keys, each list read in one C call on the hot paths.
MENTION_KEY = operator.attrgetter("key")
MENTION_CORE_KEY = operator.attrgetter("core_key")


class Outcome(NamedTuple):
    """How extraction went for a turn, as the ledger records it."""

    extractor: str
    status: str
    error: str | None = None
    latency: float = 0.0


class NewTurn(NamedTuple):
    input_text: str
    output_text: str
    mentions: Sequence[Mention]
    created_at: float
    idempotency_key: str | None = None
    outcome: Outcome = Outcome("none", "ok")

    @property
    def text(self) -> str:
        return turn_text(self.input_text, self.output_text)


class EntityRecord(NamedTuple):
    id: int
    name: str
    key: str
    entity_type: str
    first_seen: float
    last_seen: float


@dataclass(frozen=True)
class TurnRecord:
    id: int
    input_text: str
    output_text: str
    entity_names: list[str]


@dataclass(frozen=True)
class PendingTurn:
    """A turn whose extraction failed, waiting to be extracted again."""

    id: int
    session_id: str
    input_text: str
    output_text: str
    created_at: float

    @property
    def text(self) -> str:
        return turn_text(self.input_text, self.output_text)


@dataclass(frozen=True)
class SessionStats:
    entity_count: int
    message_count: int
    total_contexts: int


@dataclass(frozen=True)
class ForgetReceipt:
    """What :meth:`Repository.forget_entity` deleted."""

    entity: str | None = None
    entities: int = 0
    contexts: int = 0
    turns_deleted: int = 0
    turns_updated: int = 0
