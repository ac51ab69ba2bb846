"""CPU per async turn with and without tracing, in one process, no HTTP:

    python -m benchmarks.otel_cpu [--otel none|traces|all] [--turns 1000]

A turn is a new memory, ``aload_memory_variables`` and a keyed ``asave_context`` with an
instant async model on SQLite; ``--otel`` configures the SDK as ``benchmarks.otel_setup``
does (a BatchSpanProcessor exporting nowhere; ``all``: a meter provider too). Prints this
process's CPU per turn after 200 turns of warm-up. docs/observability.md#cost.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from benchmarks.otel_setup import configure
from benchmarks.service_apps import AsyncFakeLLM
from zerda_store import ConversationEntityMemory, Store


async def turns(store: Store, llm: AsyncFakeLLM, count: int, first: int) -> None:
    for n in range(first, first + count):
        memory = ConversationEntityMemory(
            llm, store=store, session_id=f"c{n % 50}", entity_extraction_prompt="{text}"
        )
        await memory.aload_memory_variables({"input": "What about Sarah and Acme?"})
        await memory.asave_context(
            {"input": "Sarah works at Acme"}, {"output": "Noted."}, idempotency_key=f"m{n}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--otel", choices=["none", "traces", "all"], default="none")
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args()
    if args.otel != "none":
        configure(args.otel)
    llm = AsyncFakeLLM(0.0)
    with tempfile.TemporaryDirectory() as folder, Store(f"sqlite:///{folder}/m.db") as store:
        ConversationEntityMemory(store=store, auto_migrate=True)
        asyncio.run(turns(store, llm, 200, 0))
        began = time.process_time()
        asyncio.run(turns(store, llm, args.turns, 200))
        spent = time.process_time() - began
    print(f"otel={args.otel}: {1000 * spent / args.turns:.3f} ms CPU per turn")


if __name__ == "__main__":
    main()
