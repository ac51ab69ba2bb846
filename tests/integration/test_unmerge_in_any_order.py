"""Undoing merges in any order, on both backends: every order of a scenario's merges leaves
every row as it was before them, or the unmerge refuses, changing nothing, and names the
merge to undo first.

The scenario: three entities merged into "Morgan" one after another ("Pierpont", "Chase",
"Dimon"), then "Morgan" merged into "Lehman". Each merge changes something the next one
reads: "Pierpont" brings a type and a later last sighting, "Chase" the latest one and a
snippet of a turn where "Morgan" had a snippet only through "Pierpont", "Dimon" the
earliest first sighting. Each order runs in a session of its own. (Undone oldest first,
"Morgan" used to keep the last sighting of "Pierpont".)"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

from tests.doubles import KeywordLLM, execute, query
from zerda_store import ConversationEntityMemory
from zerda_store.errors import MergeError

NAMES = ("Dimon", "Lehman", "Morgan", "Pierpont", "Chase")
TURNS = (
    "Dimon",
    "Lehman",
    "Morgan",
    "Dimon and Morgan",
    "Pierpont",
    "Morgan and Pierpont",
    "Pierpont and Chase",  # Chase's snippet is dropped: Morgan has Pierpont's by then
    "Chase",  # the latest sighting of all
)
TYPES = {"Pierpont": "ORG", "Chase": "PERSON", "Dimon": "PERSON"}
# (kept, merged), in the order they are made.
MERGES = (("Morgan", "Pierpont"), ("Morgan", "Chase"), ("Morgan", "Dimon"), ("Lehman", "Morgan"))
LAST = len(MERGES) - 1
TABLES = ("turns", "entities", "contexts", "entity_aliases", "extractions")


def _rows(database_url: str, session_id: str) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: query(
            database_url, f"SELECT * FROM {table} WHERE session_id = :s ORDER BY id", s=session_id
        )[1]
        for table in TABLES
    }


def _scenario(
    make_memory: Callable[..., ConversationEntityMemory],
    database_url: str,
    session_id: str,
    clock: Callable[[], float],
) -> tuple[ConversationEntityMemory, dict[str, list[tuple[Any, ...]]], list[int]]:
    """The session's memory, its rows before its merges, and the merges' ids in the order
    made."""
    memory = make_memory(KeywordLLM(NAMES), session_id=session_id)
    memory._now = clock  # type: ignore[method-assign]
    for text in TURNS:
        memory.save_context({"input": text}, {"output": "ok"})
    memory.add_alias("Pierpont", "JP")
    for name, entity_type in TYPES.items():
        _set_type(database_url, session_id, name, entity_type)
    before = _rows(database_url, session_id)
    ids = [memory.merge_entities(kept, merged)["merge_id"] for kept, merged in MERGES]
    return memory, before, ids


def _set_type(database_url: str, session_id: str, name: str, entity_type: str) -> None:
    """A type as an extractor that knows it would have given (the keyword double does not)."""
    execute(
        database_url,
        f"UPDATE entities SET entity_type = '{entity_type}' "
        f"WHERE session_id = '{session_id}' AND name = '{name}'",
    )


def _undo(memory: ConversationEntityMemory, merge_id: int, pending: list[int]) -> list[int]:
    """Undo ``merge_id``; where it is refused, the merge it names first. Returns the merges
    whose unmerge was refused."""
    try:
        memory.unmerge(merge_id)
    except MergeError as refused:
        named = re.search(r"undo merge (\d+) first", str(refused))
        assert named is not None, str(refused)
        first = int(named.group(1))
        assert first in pending and first != merge_id
        return [merge_id, *_undo(memory, first, pending), *_undo(memory, merge_id, pending)]
    pending.remove(merge_id)
    return []


def test_every_order_of_undoing_the_merges_leaves_every_row_as_before(
    make_memory: Callable[..., ConversationEntityMemory],
    database_url: str,
    clock: Callable[[], float],
) -> None:
    for number, order in enumerate(itertools.permutations(range(len(MERGES)))):
        session_id = f"order-{''.join(map(str, order))}"
        memory, before, ids = _scenario(make_memory, database_url, session_id, clock)
        pending = list(ids)

        refused = []
        for position in order:
            if ids[position] in pending:
                refused += _undo(memory, ids[position], pending)

        assert _rows(database_url, session_id) == before, f"order {order} (number {number})"
        # Only the merge of "Morgan" into "Lehman" ever has to be undone first.
        assert set(refused) <= set(ids[:LAST]), order
        assert bool(refused) == (order[0] != LAST), order


def test_undoing_the_older_of_two_merges_leaves_what_the_newer_alone_makes(
    make_memory: Callable[..., ConversationEntityMemory],
    database_url: str,
    clock: Callable[[], float],
) -> None:
    memory, _, ids = _scenario(make_memory, database_url, "crm", clock)
    memory.unmerge(ids[LAST])
    memory.unmerge(ids[2])  # Dimon: Morgan and Chase stay merged into Morgan
    morgan = query(database_url, SIGHTINGS, s="crm", n="Morgan")[1]
    chase_logged = query(database_url, CHASE_MERGE, s="crm")[1][0][0]

    memory.unmerge(ids[0])  # the older merge (Pierpont), under the newer one (Chase)

    info = memory.get_entity_info("Morgan")
    assert info is not None
    assert info["type"] == "PERSON"  # Chase's; no longer Pierpont's ORG
    assert info["last_seen"] == _last_seen(chase_logged)  # Chase's; no longer Pierpont's
    assert info["first_seen"] == morgan[0][0]
    # Chase's snippet of the turn naming Pierpont and Chase came back to Morgan.
    assert info["contexts_count"] == 3 + 2
    memory.unmerge(ids[1])
    assert memory.get_entity_info("Chase")["contexts_count"] == 2


SIGHTINGS = "SELECT first_seen, last_seen FROM entities WHERE session_id = :s AND name = :n"
CHASE_MERGE = "SELECT record FROM entity_merges WHERE session_id = :s AND merged_name = 'Chase'"


def _last_seen(record: Any) -> float:
    """The merged entity's last sighting, as its merge logged it."""
    logged = json.loads(record) if isinstance(record, str) else record
    return float(logged["merged"]["last_seen"])
