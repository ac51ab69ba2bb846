"""The chat turns every benchmark replays, the zero-cost model that "extracts" their
entities, and the timing helpers.

A turn names three entities drawn from a few hundred names. The model is told the answer
before each call, so extraction costs nothing and every variant sees the same entities.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from zerda_store.model.names import name_key

FIRST_NAMES = (
    *("Sarah", "Omar", "Lina", "Karim", "Maya", "Youssef", "Nour", "Adam", "Hana", "Ziad"),
    *("Rania", "Samir", "Leila", "Tariq", "Dina", "Fadi", "Salma", "Nabil", "Yara", "Hadi"),
)
LAST_NAMES = (
    *("Haddad", "Khoury", "Nasser", "Saleh", "Mansour", "Aziz", "Farah", "Hamdan"),
    *("Jaber", "Rahman", "Suleiman", "Tannous", "Zein", "Bakri", "Daher"),
)
# 300 people: a CRM assistant's few hundred customers and contacts.
NAMES: tuple[str, ...] = tuple(f"{first} {last}" for last in LAST_NAMES for first in FIRST_NAMES)
KEYS: dict[str, str] = {name: name_key(name) for name in NAMES}
ENTITIES_PER_TURN = 3
RECALL_LIMIT = 3
TEMPLATE = "Previous information about {name}:"


@dataclass(frozen=True)
class Turn:
    """One exchange: what the user said, what the assistant answered, who was named."""

    input_text: str
    output_text: str
    names: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"{self.input_text} {self.output_text}"

    @property
    def answer(self) -> str:
        """What the extraction model says about this turn."""
        return ", ".join(self.names)


@dataclass(frozen=True)
class Query:
    """A later input that names entities, as ``load_memory_variables`` receives it."""

    input_text: str
    names: tuple[str, ...]

    @property
    def answer(self) -> str:
        return ", ".join(self.names)


def make_turns(count: int, seed: int = 1, names: Sequence[str] = NAMES) -> list[Turn]:
    rng = random.Random(seed)
    turns = []
    for index in range(count):
        picked = tuple(rng.sample(names, ENTITIES_PER_TURN))
        a, b, c = picked
        turns.append(
            Turn(
                f"Turn {index}: {a} asked {b} to send the signed renewal for the {c} account "
                "before Friday, and to copy the finance team on the invoice.",
                f"Noted. I will remind {a} on Thursday and attach the last quote from {b}; "
                f"{c} keeps the same discount as last year.",
                picked,
            )
        )
    return turns


def make_queries(count: int, seed: int = 2, names: Sequence[str] = NAMES) -> list[Query]:
    rng = random.Random(seed)
    queries = []
    for _ in range(count):
        picked = tuple(rng.sample(names, ENTITIES_PER_TURN))
        queries.append(Query(f"What do we know about {', '.join(picked)}?", picked))
    return queries


class ScriptedLLM:
    """A model with zerda's ``generate(prompt, max_tokens)`` interface and no cost: it
    returns the next queued answer, else whatever answer the driver set before the call."""

    def __init__(self) -> None:
        self.answer = ""
        self.queue: deque[str] = deque()

    def generate(self, prompt: str, max_tokens: int = 100) -> str:
        return self.queue.popleft() if self.queue else self.answer


def render_recall(recalled: Iterable[tuple[str, list[str]]]) -> str:
    """The memory string, built as zerda_store builds it: one block per entity."""
    return "\n\n".join(
        TEMPLATE.format(name=name) + "\n" + "\n".join(snippets)
        for name, snippets in recalled
        if snippets
    )


# -- timing ---------------------------------------------------------------------------------


def per_call(work: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``work``, timed as one block."""
    started = time.perf_counter()
    for _ in range(calls):
        work()
    return (time.perf_counter() - started) / calls


def each_call(work: Callable[[int], object], calls: int) -> list[float]:
    """Seconds of every single call of ``work(i)``."""
    times = []
    clock = time.perf_counter
    for i in range(calls):
        started = clock()
        work(i)
        times.append(clock() - started)
    return times


@dataclass
class Samples:
    """Per-round figures of one variant; the report shows the median and the best."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def best(self) -> float:
        return min(self.values)


def interleaved(variants: dict[str, Callable[[int], float]], rounds: int) -> dict[str, Samples]:
    """Run each variant once per round, in an order that rotates every round so that a
    noisy neighbour weighs on all variants alike. ``variant(round)`` returns a figure."""
    names = list(variants)
    samples: dict[str, Samples] = {name: Samples([]) for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        order = names[shift:] + names[:shift]
        if round_number % 2:
            order.reverse()
        for name in order:
            samples[name].values.append(variants[name](round_number))
    return samples
