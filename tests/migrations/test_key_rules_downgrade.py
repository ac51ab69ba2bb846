"""Downgrading below revision 0006 on both backends: the released version (0004) finds its
data again (every entity under the key it made, every snippet where it was), or the
downgrade is refused and changes nothing; and upgrading again gives what one upgrade gave."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.migrations.released import RELEASED_REVISION, released_database, rows, save_turns
from tests.migrations.test_key_rules_upgrade import PAIRS
from tests.support import FixedLLM
from zerda_store import ConversationEntityMemory, Store, migrate

ENTITIES = (
    "SELECT id, session_id, name, name_key, entity_type, first_seen, last_seen, first_turn_id, "
    "first_position FROM entities ORDER BY id"
)
CONTEXTS = "SELECT id, session_id, entity_id, turn_id, turn_seq, text FROM contexts ORDER BY id"


@pytest.fixture
def store(empty_database_url: str) -> Iterator[Store]:
    """A released database: a fold-v1 session naming every pair, an exact session of
    lower-case names, and a session whose keys no rule changes."""
    with Store(empty_database_url) as store:
        released_database(store)
        save_turns(store, "crm", [["Sarah", *(kept for kept, _ in PAIRS)]])
        save_turns(store, "crm", [[merged for _, merged in PAIRS], ["Sarah", "Zoe"]])
        save_turns(store, "exact", [["muller"], ["müller"]], exact=True)
        save_turns(store, "plain", [["sarah"]])
        yield store


def _released_view(store: Store) -> tuple[list[Any], list[Any]]:
    return rows(store, ENTITIES), rows(store, CONTEXTS)


def _upgraded_view(store: Store) -> dict[str, Any]:
    """What one upgrade leaves, ids of the merge log aside."""
    return {
        "entities": rows(store, "SELECT id, session_id, name, name_key, core_key FROM entities "
                                "ORDER BY id"),
        "contexts": rows(store, "SELECT id, entity_id FROM contexts ORDER BY id"),
        "merges": rows(store, "SELECT session_id, kept_entity_id, merged_entity_id, kept_name, "
                              "merged_name, reason, undone_at FROM entity_merges ORDER BY id"),
        "rules": rows(store, "SELECT session_id, key_rules FROM session_key_rules "
                             "ORDER BY session_id"),
    }  # fmt: skip


def test_a_downgrade_gives_the_released_version_its_keys_and_snippets_back(store: Store) -> None:
    before = _released_view(store)
    migrate.upgrade(store)
    assert rows(store, "SELECT COUNT(*) FROM entity_merges") == [(len(PAIRS),)]
    with ConversationEntityMemory.for_session(store, "crm") as memory:
        memory.unmerge(1)  # an undone merge, and an entity held apart, go down too

    migrate.downgrade(store, RELEASED_REVISION)

    assert _released_view(store) == before


def test_upgrade_downgrade_upgrade_leaves_what_one_upgrade_left(store: Store) -> None:
    migrate.upgrade(store)
    once = _upgraded_view(store)

    migrate.downgrade(store, RELEASED_REVISION)
    migrate.upgrade(store)

    assert _upgraded_view(store) == once
    assert ("exact", "exact") in once["rules"]


def test_a_downgrade_the_released_version_could_not_read_is_refused_and_changes_nothing(
    store: Store,
) -> None:
    migrate.upgrade(store)
    # fold-v2 keeps the word "bill" apart from the name "Bill"; fold-v1 cannot.
    for name in ("Bill", "bill"):
        with ConversationEntityMemory.for_session(store, "crm", llm=FixedLLM(name)) as memory:
            memory.save_context({"input": name}, {"output": "ok"})
    upgraded = _upgraded_view(store)

    with pytest.raises(ValueError, match="cannot tell 'Bill' and 'bill' of session 'crm' apart"):
        migrate.downgrade(store, RELEASED_REVISION)

    assert migrate.current_revision(store) == migrate.head_revision()
    assert _upgraded_view(store) == upgraded
