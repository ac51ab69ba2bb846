"""A turn is stored whole or not at all: an error at any statement of a write (or just
before its COMMIT) leaves no row behind, and the next write works (SQLite and Postgres)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import VocabularyExtractor, driver_calls
from tests.reliability.helpers import VOCABULARY, inspect_database, row_counts, table_counts
from zerda_store import ConversationEntityMemory
from zerda_store.db.schema import contexts, entities, turns


class InjectedFailure(RuntimeError):
    pass


@contextmanager
def failing_at(engine: sa.Engine, index: int | None) -> Iterator[list[tuple[str, Any]]]:
    """Record the statements run on ``engine``; raise at the ``index``-th one (0-based),
    or, for ``index == len(statements)``, when the transaction is about to commit."""

    def before_statement(_cursor: Any, _statement: str, _parameters: Any) -> None:
        if len(statements) - 1 == index:
            raise InjectedFailure(f"injected at statement {index}")

    def before_commit(_connection: Any) -> None:
        if index == len(statements):
            raise InjectedFailure("injected before COMMIT")

    with driver_calls(
        engine, before_statement=before_statement, before_commit=before_commit
    ) as statements:
        yield statements


@pytest.fixture
def extractor() -> VocabularyExtractor:
    return VocabularyExtractor(VOCABULARY)


@pytest.fixture
def memory(
    make_memory: Callable[..., ConversationEntityMemory], extractor: VocabularyExtractor
) -> ConversationEntityMemory:
    return make_memory(extractor=extractor, session_id="crm-atomic")


def _rows_mentioning(connection: sa.Connection, marker: str, keys: list[str]) -> list[Any]:
    """Every row, in any table, that belongs to the turn marked ``marker``."""
    found: list[Any] = []
    found += connection.execute(
        sa.select(turns.c.id).where(turns.c.input_text.contains(marker, autoescape=True))
    ).all()
    found += connection.execute(
        sa.select(contexts.c.id).where(contexts.c.text.contains(marker, autoescape=True))
    ).all()
    found += connection.execute(sa.select(entities.c.id).where(entities.c.name_key.in_(keys))).all()
    return found


def _statement_count(memory: ConversationEntityMemory, write: Callable[[str], None]) -> int:
    """Statements of a write shaped like the failing ones: three names a turn (the number
    of rows decides how many statements a multi-row insert takes)."""
    with failing_at(memory.store.engine, None) as statements:
        write("[dry run] Alice Harper, Bilal Haddad and Carla Díaz")
    return len(statements)


def _commits(memory: ConversationEntityMemory, write: Callable[[str], None]) -> int:
    """COMMITs a write sends: none for a save sent as one pipeline (Postgres), which
    commits when the server reaches the pipeline's end."""
    commits: list[object] = []
    with driver_calls(memory.store.engine, before_commit=commits.append):
        write("[dry run] Alice Harper, Bilal Haddad and Carla Díaz")
    return len(commits)


def _save_one(memory: ConversationEntityMemory) -> Callable[[str], None]:
    return lambda text: memory.save_context({"input": text}, {"output": "Noted."})


def _save_three(memory: ConversationEntityMemory) -> Callable[[str], None]:
    def write(text: str) -> None:
        pairs = [({"input": f"{text} #{n}"}, {"output": "Noted."}) for n in range(3)]
        memory.save_contexts(pairs)

    return write


@pytest.mark.parametrize("write_of", [_save_one, _save_three], ids=["save_context", "bulk"])
def test_a_failure_at_any_statement_leaves_no_row_of_the_turn(
    memory: ConversationEntityMemory,
    extractor: VocabularyExtractor,
    database_url: str,
    write_of: Callable[[ConversationEntityMemory], Callable[[str], None]],
) -> None:
    write = write_of(memory)
    # A session's first save records its key rules too: count a later one's statements.
    write("[warm-up] Alice Harper")
    statement_count = _statement_count(memory, write)
    # Turn, entities and snippets at least; on Postgres a save may be the session's lock
    # and one statement, sent as one pipeline.
    assert statement_count >= 2

    # One failure at each statement, and one just before the COMMIT if there is one.
    for index in range(statement_count + min(_commits(memory, write), 1)):
        names = [f"Fresh Name {index}a", f"Fresh Name {index}b"]
        extractor.vocabulary = ("Alice Harper", *names)
        marker = f"[failing turn {index}]"
        with inspect_database(database_url) as connection:
            before = table_counts(connection)
            all_before = row_counts(connection)
        with (
            failing_at(memory.store.engine, index) as statements,
            pytest.raises(InjectedFailure),
        ):
            write(f"{marker} Alice Harper, {names[0]} and {names[1]}")
        assert len(statements) == min(index + 1, statement_count)
        with inspect_database(database_url) as connection:
            assert row_counts(connection) == all_before, index
            keys = [name.casefold() for name in names]
            assert _rows_mentioning(connection, marker, keys) == [], index

        write(f"[next turn {index}] Alice Harper and {names[0]}")
        with inspect_database(database_url) as connection:
            after = table_counts(connection)
        saved = after.turns - before.turns
        assert saved >= 1
        assert after.contexts - before.contexts == 2 * saved
        assert after.entities - before.entities == 1


def _forget_statement_count(
    make_memory: Callable[..., ConversationEntityMemory], with_turns: bool
) -> int:
    probe = make_memory(extractor=VocabularyExtractor(VOCABULARY), session_id=f"probe-{with_turns}")
    _save_story(probe)
    with failing_at(probe.store.engine, None) as statements:
        probe.forget_entity("Bilal Haddad", with_turns=with_turns)
    return len(statements)


def _save_story(memory: ConversationEntityMemory) -> None:
    for n in range(3):
        memory.save_context(
            {"input": f"[turn {n}] Alice Harper met Bilal Haddad"}, {"output": "Noted."}
        )


@pytest.mark.parametrize("with_turns", [False, True], ids=["keep_turns", "with_turns"])
def test_a_failed_forget_keeps_the_entity_its_snippets_and_turns(
    make_memory: Callable[..., ConversationEntityMemory],
    memory: ConversationEntityMemory,
    database_url: str,
    with_turns: bool,
) -> None:
    statement_count = _forget_statement_count(make_memory, with_turns)
    assert statement_count >= 3
    _save_story(memory)
    with inspect_database(database_url) as connection:
        before = row_counts(connection)

    for index in range(statement_count + 1):
        with failing_at(memory.store.engine, index), pytest.raises(InjectedFailure):
            memory.forget_entity("Bilal Haddad", with_turns=with_turns)
        with inspect_database(database_url) as connection:
            assert row_counts(connection) == before, index
        assert [turn["entities"] for turn in memory.chat_memory] == [
            ["Alice Harper", "Bilal Haddad"]
        ] * 3

    receipt = memory.forget_entity("Bilal Haddad", with_turns=with_turns)
    assert receipt["entity"] == "Bilal Haddad"
    assert memory.get_entity_info("Bilal Haddad") is None
    assert len(memory.chat_memory) == (0 if with_turns else 3)
