"""Run in a fresh process by section (e): how much resident memory opening a store and
using it adds. Prints ``{"before_mb": …, "after_mb": …}``.

Usage: ``python -m benchmarks.rss_probe URL SESSION NAME...``
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import sqlalchemy  # noqa: F401  (imported before the first reading, like the library)

from zerda_store import ConversationEntityMemory

from .workload import ScriptedLLM


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(url: str, session_id: str, names: list[str]) -> None:
    if url.startswith("postgresql"):
        import psycopg  # noqa: F401  (the driver is not what is measured)
    llm = ScriptedLLM()
    gc.collect()
    before = rss_mb()
    memory = ConversationEntityMemory(llm, database_url=url, session_id=session_id)
    for name in names:
        llm.answer = name
        memory.load_memory_variables({"input": f"What about {name}?"})
    memory.get_memory_stats()
    len(memory.entity_store)
    memory.chat_memory[-1]
    gc.collect()
    after = rss_mb()
    memory.close()
    print(json.dumps({"before_mb": before, "after_mb": after}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
