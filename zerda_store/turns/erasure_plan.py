"""The values a long erasure is planned and done with (:mod:`erasure`): its batches,
what they did, and how a text is searched for a name. Pure: no I/O."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..db.execution.unit_of_work import SessionLock, Transaction, writers_poll
from ..model.names import name_key
from ..model.records import ForgetReceipt
from .erasure_statements import ErasureStatements

# Turns one transaction of a long erasure deletes or rewrites: a few tens of milliseconds
# on either backend, so that other sessions' saves (on SQLite, waiting for the one
# writer) never wait long.
ERASURE_BATCH = 500
# The longest pause between two batches on SQLite (seconds): longer than the longest sleep
# of its busy handler's polling (0.1 s), so that a waiting save gets the write lock.
BATCH_PAUSE = 0.2

Step = tuple[Callable[[Transaction], Any], SessionLock | None]


class RolledBack(Exception):
    """Raised at the end of a dry run's unit of work, carrying its receipt: the
    transaction rolls back."""

    def __init__(self, receipt: ForgetReceipt | None) -> None:
        super().__init__("dry run")
        self.receipt = receipt


def rolled_back(
    work: Callable[[Transaction], ForgetReceipt | None],
) -> Callable[[Transaction], ForgetReceipt | None]:
    def run(transaction: Transaction) -> ForgetReceipt | None:
        raise RolledBack(work(transaction))

    return run


@dataclass
class Plan:
    """What a long erasure will reach, read before it begins (see the module)."""

    newest: int = 0
    turn_ids: set[int] = field(default_factory=set)
    updates: list[dict[str, Any]] = field(default_factory=list)
    others: set[int] = field(default_factory=set)
    names: set[str] = field(default_factory=set)


@dataclass
class Done:
    """What the batches of a long erasure did, for its last unit of work and receipt."""

    after_id: int = 0
    turns: int = 0
    snippets: int = 0
    updated: int = 0
    others: set[int] = field(default_factory=set)
    names: set[str] = field(default_factory=set)

    def add(self, deleted: tuple[int, int]) -> None:
        self.snippets += deleted[0]
        self.turns += deleted[1]


def chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    ordered = sorted(items, key=lambda item: item["turn_id"] if isinstance(item, dict) else item)
    for start in range(0, len(ordered), ERASURE_BATCH):
        yield ordered[start : start + ERASURE_BATCH]


def name_updates(
    session_id: str, rows: list[Any], keys: set[str], normalize: bool
) -> list[dict[str, Any]]:
    """Each turn's entity list without the names whose key is one of ``keys``."""
    return [
        {
            "session_id": session_id,
            "turn_id": row.id,
            "names": [
                name for name in row.entity_names if name_key(name, normalize=normalize) not in keys
            ],
        }
        for row in rows
    ]


@dataclass
class Mentioning:
    """What deleting the turns that mention a name deleted, and the names they listed."""

    turns: int = 0
    snippets: int = 0
    names: set[str] = field(default_factory=set)


def whole_words(key: str, normalize: bool) -> re.Pattern[str]:
    """The name as whole words: "Ann" is not in "annual". Normalized keys are compared
    casefolded (a word's key keeps its capital: "Bill")."""
    return re.compile(rf"(?<!\w){re.escape(key.casefold() if normalize else key)}(?!\w)")


def searchable(text: str, normalize: bool) -> str:
    """A text as the keys it may hold are searched for in it."""
    return name_key(text, normalize=normalize).casefold() if normalize else text


def pause_after(dialect: str, lock: SessionLock | None, took: float) -> float:
    """How long to wait after a batch before the next: on SQLite, whose waiting writers
    poll for the one write lock (they are not queued), as long as the batch took (at most
    ``BATCH_PAUSE``), so that they get it in between; elsewhere none."""
    if lock is None or not writers_poll(dialect):
        return 0.0
    return min(took, BATCH_PAUSE)


def delete_batch_work(
    statements: ErasureStatements, session_id: str, turn_ids: list[int]
) -> Callable[[Transaction], tuple[int, int]]:
    """Delete these turns and their snippets; how many snippets, how many turns."""
    ids = [{"session_id": session_id, "turn_id": turn_id} for turn_id in turn_ids]

    def work(transaction: Transaction) -> tuple[int, int]:
        snippets = transaction.run_many(statements.delete_turn_snippets, ids)
        return snippets, transaction.run_many(statements.delete_turn, ids)

    return work


def update_batch_work(
    statements: ErasureStatements, updates: list[dict[str, Any]]
) -> Callable[[Transaction], int]:
    """Rewrite these turns' entity lists; how many."""

    def work(transaction: Transaction) -> int:
        transaction.run_many(statements.set_names, updates)
        return len(updates)

    return work


def turns_mentioning(
    transaction: Transaction,
    statements: ErasureStatements,
    session_id: str,
    keys: set[str],
    normalize: bool,
    after_id: int,
) -> list[Any]:
    """The session's turns after ``after_id`` whose text holds one of ``keys`` as whole
    words."""
    patterns = [whole_words(key, normalize) for key in keys if key]
    if not patterns:  # a name of no letters or digits mentions nothing
        return []
    values = {"session_id": session_id, "after_id": after_id}
    return [
        row
        for row in transaction.run(statements.session_turns, values)
        if any(
            pattern.search(searchable(f"{row.input_text} {row.output_text}", normalize))
            for pattern in patterns
        )
    ]
