"""CPU per turn of the async path against the sync path, in one process, without HTTP.

A turn is ``load_memory_variables`` then ``save_context`` (with an idempotency key), on a
memory made for the turn from one shared :class:`Store`, with an instant keyword LLM. The
same turns go through the sync calls and through the async ones (awaited one after the
other on one event loop), rounds interleaved; the figure is this process's CPU time per
turn (``time.process_time``: the Postgres server's own time is not in it) and the ratio
of the two::

    python -m benchmarks.async_cpu                 # both backends
    python -m benchmarks.async_cpu --backend sqlite --turns 400
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from zerda_store import ConversationEntityMemory, Store

from .databases import Databases

PEOPLE = ["Sarah Chen", "Omar Haddad", "Acme Corp", "Berlin", "Lena Park", "Kyoto"]


class KeywordLLM:
    """Names the known people in the prompt, instantly."""

    def generate(self, prompt: str, max_tokens: int = 100) -> str:
        return ", ".join(name for name in PEOPLE if name in prompt)

    async def agenerate(self, prompt: str, max_tokens: int = 100) -> str:
        return self.generate(prompt, max_tokens)


def _text(n: int) -> str:
    return f"{PEOPLE[n % 6]} met {PEOPLE[(n + 1) % 6]} about order {n}"


def sync_round(store: Store, session: str, turns: int) -> float:
    llm = KeywordLLM()
    began = time.process_time()
    for n in range(turns):
        memory = ConversationEntityMemory(llm, store=store, session_id=session)
        memory.load_memory_variables({"input": _text(n)})
        memory.save_context({"input": _text(n)}, {"output": "ok"}, idempotency_key=f"s{n}")
    return (time.process_time() - began) / turns


def async_round(store: Store, session: str, turns: int) -> float:
    llm = KeywordLLM()

    async def run() -> float:
        began = time.process_time()
        for n in range(turns):
            memory = ConversationEntityMemory(llm, store=store, session_id=session)
            await memory.aload_memory_variables({"input": _text(n)})
            await memory.asave_context(
                {"input": _text(n)}, {"output": "ok"}, idempotency_key=f"a{n}"
            )
        return (time.process_time() - began) / turns

    return asyncio.run(run())


def measure(url: str, turns: int, rounds: int) -> dict[str, Any]:
    sync_times: list[float] = []
    async_times: list[float] = []
    with Store(url) as store:
        ConversationEntityMemory(store=store, auto_migrate=True)
        for r in range(rounds):
            sync_times.append(sync_round(store, f"sync-{r}", turns))
            async_times.append(async_round(store, f"async-{r}", turns))
    sync_ms, async_ms = 1000 * min(sync_times), 1000 * min(async_times)
    return {
        "sync_ms": sync_ms,
        "async_ms": async_ms,
        "ratio": async_ms / sync_ms,
        "async_median_ms": 1000 * statistics.median(async_times),
        "sync_median_ms": 1000 * statistics.median(sync_times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    print("| backend  | sync CPU ms/turn | async CPU ms/turn | async / sync | (medians) |")
    for backend in backends:
        with Databases(backend) as databases:
            row = measure(databases.new("cpu").url, args.turns, args.rounds)
            print(
                f"| {backend:8} | {row['sync_ms']:16.2f} | {row['async_ms']:17.2f} "
                f"| {row['ratio']:12.2f} | {row['sync_median_ms']:.2f} / "
                f"{row['async_median_ms']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
