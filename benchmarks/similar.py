"""How long ``similar_entities()`` (``entities --similar``) takes on a session of many
entities, look-alikes included: the work must grow with the number of entities, not
its square (target: under 2 s for 10,000).

A session of N entities is written to a fresh SQLite file through ``save_contexts``:
people (first and last names, some misspelt, some titled), companies (legal forms,
possessives) and numbered look-alikes ("Client Account 004217", "Customer ab Holdings
17"). Then ``similar_entities(limit=100)`` and ``similar_entities()`` (every pair) are
timed through the API (reading the names included), and the pure pairing alone.

    python -m benchmarks.similar [--sizes 10000 100000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from zerda_store import ConversationEntityMemory
from zerda_store.identity.similar import similar_pairs
from zerda_store.model.names import FOLD_V2

FIRST = ["Sarah", "Omar", "John", "Fatima", "Ahmed", "Maria", "Wei", "Robert", "Aisha", "Yusuf"]
LAST = ["Chen", "Haddad", "Smith", "Rashid", "Garcia", "Okafor", "Novak", "Tanaka", "Silva"]
FORMS = ["Ltd", "Inc.", "GmbH", "LLC", ""]
PER_TURN = 20
T = TypeVar("T")


def entity_names(count: int) -> list[str]:
    """``count`` distinct entity names, a fifth of each kind."""
    names: list[str] = []
    i = 0
    while len(names) < count:
        first, last = FIRST[i % len(FIRST)], LAST[i // len(FIRST) % len(LAST)]
        person = f"{first} {last}{i // 90 or ''}"
        names.append(person)
        names.append(person.replace("a", "e", 1) if i % 7 == 0 else f"Dr. {person}")
        names.append(f"Company {i} {FORMS[i % len(FORMS)]}".strip())
        names.append(f"Client Account {i:06d}")
        names.append(f"Customer {chr(97 + i % 26)}{chr(97 + i // 26 % 26)} Holdings {i}")
        i += 1
    return list(dict.fromkeys(names))[:count]


class Listed:
    """An extractor that names the entities listed in the turn's text, one per line."""

    name = "listed"

    def extract(self, text: str) -> list[str]:
        return [line for line in text.split("\n") if line and line != "ok"]


def timed(call: Callable[[], T]) -> tuple[T, float, float]:
    """``call()``, its wall time and its CPU time (the machine may be shared: CPU time
    is what the work itself costs)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def run(count: int, folder: Path) -> dict[str, float]:
    names = entity_names(count)
    url = f"sqlite:///{folder / f'similar-{count}.db'}"
    with ConversationEntityMemory(extractor=Listed(), database_url=url) as memory:
        turns = [
            ({"input": "\n".join(names[at : at + PER_TURN])}, {"output": "ok"})
            for at in range(0, count, PER_TURN)
        ]
        memory.save_contexts(turns)
        stored = len(memory.entity_store)
        figures = {"entities": float(stored)}
        best, figures["api_limit_100_s"], figures["api_limit_100_cpu"] = timed(
            lambda: memory.similar_entities(limit=100)
        )
        every, figures["api_all_s"], figures["api_all_cpu"] = timed(memory.similar_entities)
    _, figures["pairing_s"], figures["pairing_cpu"] = timed(lambda: similar_pairs(names, FOLD_V2))
    figures["pairs"] = float(len(every))
    figures["best_shown"] = float(len(best))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as folder:
        for count in args.sizes:
            f = run(count, Path(folder))
            print(
                f"{int(f['entities']):>7,} entities, {int(f['pairs']):,} pairs (wall / CPU): "
                f"similar_entities(limit=100) {f['api_limit_100_s']:.2f} / "
                f"{f['api_limit_100_cpu']:.2f} s; similar_entities() {f['api_all_s']:.2f} / "
                f"{f['api_all_cpu']:.2f} s; pairing with cores computed {f['pairing_s']:.2f} / "
                f"{f['pairing_cpu']:.2f} s"
            )


if __name__ == "__main__":
    main()
