"""The merges an upgrade's new key rules made, undone in every order, on both backends:
five spellings of "J. P. Morgan" that the released version kept apart are one key under
fold-v2, so the upgrade merges four of them into the first seen; undoing those four in any
of the 24 orders gives back every entity's fields and every snippet as the released
version left them (the keys stay the new rules' and held apart). Undone oldest first, the
kept entity used to keep the last sighting of the first merged spelling."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.migrations.released import released_database, rows, save_turns
from zerda_store import ConversationEntityMemory, Store, migrate

SPELLINGS = ("J. P. Morgan", "J.P. Morgan", "JP Morgan", "J P Morgan", "J.P.Morgan")
ORDERS = list(itertools.permutations(range(len(SPELLINGS) - 1)))
# What an unmerge gives back, key columns aside (the new rules re-keyed them).
ENTITIES = (
    "SELECT id, name, entity_type, first_seen, last_seen, first_turn_id, first_position "
    "FROM entities WHERE session_id = :s ORDER BY id"
)
SNIPPETS = (
    "SELECT id, entity_id, turn_id, turn_seq, text FROM contexts WHERE session_id = :s ORDER BY id"
)


def _session(order: tuple[int, ...]) -> str:
    return "order-" + "".join(map(str, order))


@pytest.fixture
def store(empty_database_url: str) -> Iterator[Store]:
    with Store(empty_database_url) as store:
        released_database(store)
        for order in ORDERS:
            # Each spelling in a turn of its own, then the first two together (one of the
            # merged spelling's snippets is dropped: the kept entity has one of that turn).
            turns = [[name] for name in SPELLINGS] + [[SPELLINGS[1], SPELLINGS[0]]]
            save_turns(store, _session(order), turns)
        yield store


def test_every_order_of_undoing_the_upgrades_merges_gives_back_the_released_rows(
    store: Store,
) -> None:
    before = {
        _session(order): (
            rows(store, ENTITIES, s=_session(order)),
            rows(store, SNIPPETS, s=_session(order)),
        )
        for order in ORDERS
    }

    report = migrate.upgrade(store)

    merges = {entry["session_id"]: [m["merge_id"] for m in entry["merges"]] for entry in report}
    for order in ORDERS:
        session_id = _session(order)
        assert len(merges[session_id]) == len(order)
        with ConversationEntityMemory.for_session(store, session_id) as memory:
            for position in order:
                memory.unmerge(merges[session_id][position])
        after = (rows(store, ENTITIES, s=session_id), rows(store, SNIPPETS, s=session_id))
        assert after == before[session_id], order
