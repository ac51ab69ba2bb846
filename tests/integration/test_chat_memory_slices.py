"""``chat_memory`` slices with any step, ``reversed`` and ``index`` behave exactly as a list
of the same turns does, and read the turns a page at a time: a handful of statements for a
session of 1,200 turns, not one per turn (SQLite and Postgres)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import FixedLLM, driver_calls
from zerda_store import ConversationEntityMemory
from zerda_store.turns import repository

Maker = Callable[..., ConversationEntityMemory]
SMALL = 23
LARGE = 1_200  # more than two pages of 500


def saved(make_memory: Maker, count: int, session_id: str = "s") -> ConversationEntityMemory:
    memory = make_memory(FixedLLM(""), session_id=session_id)
    memory.save_contexts(({"input": f"turn {i}"}, {"output": f"reply {i}"}) for i in range(count))
    return memory


def inputs(turns: list[dict[str, Any]]) -> list[str]:
    return [turn["input"] for turn in turns]


bounds = st.none() | st.integers(-2 * SMALL - 3, 2 * SMALL + 3)
steps = st.none() | st.integers(-SMALL - 3, SMALL + 3).filter(bool)


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pages of 4 turns, so that a session of 23 crosses many page boundaries."""
    monkeypatch.setattr(repository, "PAGE_SIZE", 4)
    return 4


@pytest.fixture
def small_session(make_memory: Maker, small_pages: int) -> ConversationEntityMemory:
    """A session of 23 turns read in pages of 4 (one for all of a property test's examples)."""
    return saved(make_memory, SMALL)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(start=bounds, stop=bounds, step=steps)
def test_any_slice_equals_the_same_slice_of_a_list(
    small_session: ConversationEntityMemory, start: int | None, stop: int | None, step: int | None
) -> None:
    index = slice(start, stop, step)
    expected = list(small_session.chat_memory)
    assert len(expected) == SMALL

    assert small_session.chat_memory[index] == expected[index]


@pytest.mark.parametrize("count", [0, 1, 2, 5])
def test_slices_of_short_sessions_equal_the_list_s(make_memory, small_pages, count):
    memory = saved(make_memory, count)
    expected = list(memory.chat_memory)
    assert len(expected) == count
    values = [None, *range(-count - 2, count + 3)]
    for start in values:
        for stop in values:
            for step in [None, -3, -2, -1, 1, 2, 3, count + 1, -count - 1]:
                index = slice(start, stop, step)
                assert memory.chat_memory[index] == expected[index], index
    assert list(reversed(memory.chat_memory)) == expected[::-1]
    with pytest.raises(ValueError, match="slice step cannot be zero"):
        memory.chat_memory[::0]


@pytest.mark.parametrize(
    "index",
    [
        slice(None, None, -1),
        slice(None, None, 2),
        slice(-4000, None, 2),
        slice(None, None, -2),
        slice(499, 1001, 7),
        slice(1100, 10, -3),
        slice(None, None, 500),
        slice(None, None, -501),
        slice(-1, -1201, -1),
        slice(5000, None, -1),
    ],
)
def test_slices_across_pages_equal_the_list_s(make_memory, index):
    memory = saved(make_memory, LARGE)
    expected = list(memory.chat_memory)
    assert inputs(expected) == [f"turn {i}" for i in range(LARGE)]

    assert memory.chat_memory[index] == expected[index]


def test_reversed_gives_the_turns_newest_first(make_memory, small_pages):
    memory = saved(make_memory, SMALL)
    other = saved(make_memory, 3, session_id="other")

    assert inputs(list(reversed(memory.chat_memory))) == [
        f"turn {i}" for i in reversed(range(SMALL))
    ]
    assert list(reversed(memory.chat_memory)) == list(memory.chat_memory)[::-1]
    assert inputs(list(reversed(other.chat_memory))) == ["turn 2", "turn 1", "turn 0"]
    assert list(reversed(saved(make_memory, 0, session_id="empty").chat_memory)) == []


def test_index_finds_a_turn_as_a_list_does(make_memory, small_pages):
    memory = saved(make_memory, SMALL)
    expected = list(memory.chat_memory)
    turn = expected[9]

    for bounds in [(), (0,), (9, 10), (-14,), (-100, 100), (3, -1)]:
        assert memory.chat_memory.index(turn, *bounds) == expected.index(turn, *bounds)
    for bounds in [(10,), (0, 9), (-13,), (9, 9), (30, 2)]:
        with pytest.raises(ValueError):
            expected.index(turn, *bounds)
        with pytest.raises(ValueError):
            memory.chat_memory.index(turn, *bounds)
    with pytest.raises(ValueError):
        memory.chat_memory.index({"input": "never said", "output": "", "entities": []})


@pytest.mark.parametrize(
    "read",
    [
        lambda turns: turns[::-1],
        lambda turns: list(reversed(turns)),
        lambda turns: turns[-4000::2],
        lambda turns: turns[::-3],
        lambda turns: turns.index(turns[-1]),
    ],
    ids=["[::-1]", "reversed", "[-4000::2]", "[::-3]", "index"],
)
def test_stepped_and_reversed_reads_take_a_handful_of_statements(make_memory, read):
    memory = saved(make_memory, LARGE)

    with driver_calls(memory.store.engine) as sent:
        read(memory.chat_memory)

    # at most: a count, three pages of 500 and the snapshot's BEGIN or SET TRANSACTION
    assert len(sent) <= 6, [statement for statement, _ in sent]
