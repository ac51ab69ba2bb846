"""Shared pieces of the reliability suites: a deterministic workload, and
direct SQL reads of the tables (tests may use SQL; the library's API is what they check).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import sqlalchemy as sa

from tests.doubles import direct_url
from zerda_store.db.schema import contexts, entities, metadata, turns
from zerda_store.model.names import name_key

# Latin, accented, Arabic and CJK names, so keys differ from display names in several ways.
VOCABULARY = (
    "Alice Harper",
    "Bilal Haddad",
    "Carla Díaz",
    "Dmitri Volkov",
    "Ebru Kaya",
    "سارة أحمد",
    "Gao Min",
    "Hana Sato",
)
TAG = re.compile(r"^\[(?P<tag>[^\]]+)\]")


def turn_names(worker: int, index: int, per_turn: int = 3) -> list[str]:
    """The names one turn of a worker mentions: overlapping windows of the vocabulary,
    in the opposite order for odd workers so that input orders differ between workers."""
    start = (worker + index) % len(VOCABULARY)
    names = [VOCABULARY[(start + k) % len(VOCABULARY)] for k in range(per_turn)]
    return names[::-1] if worker % 2 else names


def turn_input(tag: str, names: Sequence[str]) -> str:
    """An input text that starts with ``[tag]`` and names ``names`` in order."""
    return f"[{tag}] " + " met ".join(names) + " about the renewal; it's 50% done_ \\o/."


def tag_of(input_text: str) -> str:
    match = TAG.match(input_text)
    assert match is not None, f"a turn without a tag: {input_text[:60]!r}"
    return match["tag"]


class TableCounts(NamedTuple):
    turns: int
    entities: int
    contexts: int


def table_counts(connection: sa.Connection, session_id: str | None = None) -> TableCounts:
    """Row counts of the three tables (of one session, or all of them)."""

    def count(table: sa.Table) -> int:
        query = sa.select(sa.func.count()).select_from(table)
        if session_id is not None:
            query = query.where(table.c.session_id == session_id)
        return int(connection.execute(query).scalar_one())

    return TableCounts(count(turns), count(entities), count(contexts))


def row_counts(connection: sa.Connection) -> dict[str, int]:
    """Row counts of every table the library defines (new tables included as they come)."""
    return {
        table.name: int(
            connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
        )
        for table in metadata.sorted_tables
    }


@contextmanager
def inspect_database(url: str) -> Iterator[sa.Connection]:
    """A plain connection (no zerda_store settings) for reading the tables afterwards."""
    engine = sa.create_engine(direct_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def snippet_keys_by_turn(connection: sa.Connection, session_id: str) -> dict[str, list[str]]:
    """For every turn of the session, by its tag: the entity keys of its snippets."""
    rows = connection.execute(
        sa.select(turns.c.input_text, entities.c.name_key)
        .select_from(turns)
        .outerjoin(contexts, contexts.c.turn_id == turns.c.id)
        .outerjoin(entities, entities.c.id == contexts.c.entity_id)
        .where(turns.c.session_id == session_id)
    ).all()
    by_turn: dict[str, list[str]] = {}
    for input_text, key in rows:
        keys = by_turn.setdefault(tag_of(input_text), [])
        if key is not None:
            keys.append(key)
    return by_turn


def duplicated_tags(connection: sa.Connection, session_id: str) -> list[str]:
    """Tags that occur on more than one turn of the session."""
    rows = connection.execute(
        sa.select(turns.c.input_text).where(turns.c.session_id == session_id)
    ).scalars()
    counts = Counter(tag_of(text) for text in rows)
    return sorted(tag for tag, n in counts.items() if n > 1)


def keys_of(names: Sequence[str]) -> list[str]:
    return sorted(name_key(name) for name in names)
