"""The writer of the crash suite: it saves turns until it is killed, and acknowledges each
one (by its index) on a pipe after ``save_context`` returns.

It runs in a child of a ``forkserver`` that has imported this module already, so a round
costs a fork rather than a fresh interpreter.
"""

from __future__ import annotations

from typing import Any

from tests.doubles import VocabularyExtractor
from tests.reliability.helpers import VOCABULARY, turn_input, turn_names
from zerda_store import ConversationEntityMemory

READY = -1


def crash_turn(round_number: int, index: int) -> tuple[str, list[str]]:
    """The tag and names of the ``index``-th turn of a round (one to three names)."""
    names = turn_names(round_number, index, per_turn=1 + index % 3)
    return f"r{round_number}-{index}", names


def write_until_killed(url: str, session_id: str, round_number: int, acks: Any) -> None:
    memory = ConversationEntityMemory(
        extractor=VocabularyExtractor(VOCABULARY), database_url=url, session_id=session_id
    )
    acks.send(READY)
    index = 0
    while True:
        tag, names = crash_turn(round_number, index)
        memory.save_context({"input": turn_input(tag, names)}, {"output": "Noted " * 20})
        acks.send(index)
        index += 1
