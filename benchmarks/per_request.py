"""Section (h): one memory per request, the service pattern the README recommends.

One shared ``Store``; a turn (``load_memory_variables``, then ``save_context``) goes either
through a memory kept for its customer's whole conversation, or through a new
``ConversationEntityMemory`` made for the request and closed after it. Both variants replay
the same turns over the same number of customers (turn ``i`` goes to customer ``i mod n``,
whose conversation names its own few dozen people), each in its own sessions, so their
sessions hold the same rows and their loads must give the same memory strings. The figure is
CPU time (``time.process_time``): on Postgres the server's time is not the library's. Wall
time is shown too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from zerda_store import ConversationEntityMemory, Store

from .databases import Databases
from .report import Figure, ratio_figure
from .workload import NAMES, Query, Samples, ScriptedLLM, Turn, interleaved, make_turns

CUSTOMERS = 8
WARM_UP = 40
TARGET = 1.3


def _turn(memory: ConversationEntityMemory, llm: ScriptedLLM, turn: Turn, query: Query) -> str:
    llm.answer = query.answer
    loaded = str(memory.load_memory_variables({"input": query.input_text})["entity_info"])
    llm.answer = turn.answer
    memory.save_context({"input": turn.input_text}, {"output": turn.output_text})
    return loaded


def per_request(dbs: Databases, turn_count: int, rounds: int) -> list[Figure]:
    """(h): CPU per turn with a new memory per request against one memory kept per
    customer, both on one shared store."""
    store = Store(dbs.get("zerda").url)
    llm = ScriptedLLM()
    kept = [
        ConversationEntityMemory(llm, store=store, session_id=f"kept-{k}") for k in range(CUSTOMERS)
    ]
    # Each customer's conversation names its own few dozen contacts, so most loads recall.
    count = WARM_UP + turn_count
    conversations = [
        make_turns(count // CUSTOMERS + 1, seed=6 + k, names=NAMES[k::CUSTOMERS])
        for k in range(CUSTOMERS)
    ]
    turns = [conversations[i % CUSTOMERS][i // CUSTOMERS] for i in range(count)]
    # The turn's own input names the entities it then saves, as in a real exchange.
    queries = [Query(turn.input_text, turn.names) for turn in turns]
    loaded: dict[str, list[str]] = {"kept": [], "new": []}

    def kept_turn(i: int) -> None:
        loaded["kept"].append(_turn(kept[i % CUSTOMERS], llm, turns[i], queries[i]))

    def new_turn(i: int) -> None:
        with ConversationEntityMemory(llm, store=store, session_id=f"anew-{i % CUSTOMERS}") as m:
            loaded["new"].append(_turn(m, llm, turns[i], queries[i]))

    walls: dict[str, Samples] = {"kept": Samples([]), "new": Samples([])}
    size = turn_count // rounds

    def block(name: str, work: Callable[[int], None]) -> Callable[[int], float]:
        def run(r: int) -> float:
            chunk = range(WARM_UP + r * size, WARM_UP + (r + 1) * size)
            cpu, wall = time.process_time(), time.perf_counter()
            for i in chunk:
                work(i)
            walls[name].values.append((time.perf_counter() - wall) / size)
            return (time.process_time() - cpu) / size

        return run

    try:
        for i in range(WARM_UP):
            kept_turn(i)
            new_turn(i)
        cpus = interleaved(
            {"kept": block("kept", kept_turn), "new": block("new", new_turn)}, rounds
        )
    finally:
        for memory in kept:
            memory.close()
        store.close()
    same = loaded["kept"] == loaded["new"]
    what = f"whole turn (load + save), a new memory per request, {CUSTOMERS} customers"
    check = "same memory strings" if same else "LOAD OUTPUTS DIFFER"
    reference = "one memory kept per customer"
    return [
        ratio_figure(
            "h",
            dbs.backend,
            f"{what}: CPU time",
            cpus["new"],
            cpus["kept"],
            reference,
            limit=TARGET,
            note=check,
        ),
        ratio_figure(
            "h", dbs.backend, f"{what}: wall time", walls["new"], walls["kept"], reference
        ),
    ]
