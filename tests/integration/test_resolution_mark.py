"""The per-session mark that lets SQLite skip name resolution: a session with no alias and
no titled form (an entity whose key is not its core) saves and recalls the mentions that
are their own cores by their keys alone. The mark is read in the statement that needs it,
so a write of another store (another process) is seen by the next call, and every write
that adds or removes an alias or a titled form keeps it exact."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from tests.doubles import KeywordLLM, driver_calls
from zerda_store import ConversationEntityMemory, Store
from zerda_store.admin import AdminRepository
from zerda_store.identity.statements import resolution_possible

NAMES = ["Robert Smith", "Bobby", "Dr. Sarah Chen", "Sarah Chen", "Mia Park", "Acme Inc.", "Acme"]
ON_SQLITE = pytest.mark.parametrize("empty_database_url", ["sqlite"], indirect=True)


def say(memory: ConversationEntityMemory, text: str) -> None:
    memory.save_context({"input": text}, {"output": "ok"})


def recall(memory: ConversationEntityMemory, text: str) -> str:
    return str(memory.load_memory_variables({"input": text})["entity_info"])


def mark(store: Store, session_id: str) -> bool:
    """The session's mark as the hot path reads it."""
    with store.connect() as connection:
        query = sa.select(resolution_possible(session_id))
        return bool(connection.execute(query).scalar())


def on_store(store: Store, session_id: str = "crm") -> ConversationEntityMemory:
    return ConversationEntityMemory(KeywordLLM(NAMES), store=store, session_id=session_id)


@pytest.fixture
def two_stores(
    database_url: str,
) -> Iterator[tuple[ConversationEntityMemory, ConversationEntityMemory]]:
    """Two memories of one session on two stores of one database, as two processes have."""
    with Store(database_url) as one, Store(database_url) as other:
        yield on_store(one), on_store(other)


def _statements(sent: list[tuple[str, object]]) -> list[str]:
    """Each statement by its first three words."""
    return [" ".join(statement.split()[:3]) for statement, _ in sent]


@ON_SQLITE
def test_a_session_without_aliases_or_titled_forms_never_looks_names_up(
    make_memory: Callable[..., ConversationEntityMemory],
) -> None:
    memory = make_memory(KeywordLLM(NAMES), session_id="crm")
    say(memory, "Robert Smith renewed")  # the first save checks the key rules too

    with driver_calls(memory.store.engine) as sent:
        say(memory, "Robert Smith and Mia Park met")
    # The turn (which returns the mark), its entities, snippets and ledger row: no lookup.
    assert _statements(sent) == [
        "BEGIN IMMEDIATE",
        "INSERT INTO turns",
        "INSERT INTO entities",
        "INSERT INTO contexts",
        "INSERT INTO extractions",
    ]

    with driver_calls(memory.store.engine) as sent:
        # A known name and one no turn has named: one statement all the same.
        answer = recall(memory, "Robert Smith and Sarah Chen?")
    assert len(sent) == 1
    assert answer.startswith("Previous information about Robert Smith:")


def test_an_alias_another_store_adds_is_seen_by_the_next_save_and_recall(
    two_stores: tuple[ConversationEntityMemory, ConversationEntityMemory],
) -> None:
    mine, theirs = two_stores
    say(mine, "Robert Smith renewed")
    assert recall(mine, "Bobby?") == ""

    assert theirs.add_alias("Robert Smith", "Bobby") is True
    assert recall(mine, "Bobby?").startswith("Previous information about Robert Smith:")
    say(mine, "Bobby called")
    assert mine.list_entities() == ["Robert Smith"]

    assert theirs.remove_alias("Bobby") is True
    assert recall(mine, "Bobby?") == ""
    say(mine, "Bobby called again")
    assert mine.list_entities() == ["Robert Smith", "Bobby"]


def test_a_titled_form_another_store_saves_is_joined_by_the_next_bare_mention(
    two_stores: tuple[ConversationEntityMemory, ConversationEntityMemory],
) -> None:
    mine, theirs = two_stores
    say(mine, "Mia Park renewed")
    assert recall(mine, "Sarah Chen?") == ""

    say(theirs, "Dr. Sarah Chen called")
    assert recall(mine, "Sarah Chen?").startswith("Previous information about Dr. Sarah Chen:")
    say(mine, "Sarah Chen signed")
    assert mine.list_entities() == ["Mia Park", "Dr. Sarah Chen"]


def test_every_write_that_adds_or_removes_an_alias_or_a_titled_form_keeps_the_mark_exact(
    make_memory: Callable[..., ConversationEntityMemory],
) -> None:
    memory = make_memory(KeywordLLM(NAMES), session_id="crm")
    store = memory.store
    say(memory, "Robert Smith and Mia Park renewed")
    assert mark(store, "crm") is False

    memory.add_alias("Robert Smith", "Bobby")
    assert mark(store, "crm") is True
    memory.remove_alias("Bobby")
    assert mark(store, "crm") is False

    say(memory, "Acme Inc. signed")  # a titled form of its own
    assert mark(store, "crm") is True
    memory.forget_entity("Acme Inc.")
    assert mark(store, "crm") is False

    receipt = memory.merge_entities("Robert Smith", "Mia Park")  # "Mia Park" as an alias
    assert mark(store, "crm") is True
    memory.unmerge(receipt["merge_id"])
    assert mark(store, "crm") is False

    memory.add_alias("Robert Smith", "Bobby")
    admin = AdminRepository(store)
    admin.import_session("copy", list(admin.export_session("crm")))
    assert mark(store, "copy") is True
    copy = on_store(store, "copy")
    assert recall(copy, "Bobby?").startswith("Previous information about Robert Smith:")
    copy.clear()
    assert mark(store, "copy") is False
    assert mark(store, "crm") is True  # another session's aliases are its own
