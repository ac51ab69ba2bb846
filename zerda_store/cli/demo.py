"""A short scripted CRM conversation that shows what the memory recalls.

The stand-in LLM answers the extraction prompt by spotting a fixed list of names, so the
demo runs offline and costs nothing. Run it twice: the second run starts from what the
first one stored, and delivers the same turns again with the same idempotency keys, so
nothing is stored twice and the recall shows what survived.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import ConversationEntityMemory, Store
from .common import plural

DEMO_SESSION = "demo"
NAMES = ("Acme Corp", "Sarah Chen", "Berlin", "Globex", "Omar Haddad")
TURNS = (
    (
        "Hi, this is Acme Corp. Sarah Chen is our new head of procurement.",
        "Welcome! I have noted Sarah Chen as your procurement lead.",
    ),
    (
        "Sarah Chen wants a quote for 200 licences, delivered to our Berlin office.",
        "I will prepare the quote for Berlin this week.",
    ),
    (
        "Omar Haddad from Globex asked about renewing their support plan.",
        "Thanks, I will send Omar Haddad the renewal options.",
    ),
)
QUESTIONS = ("What did Sarah Chen ask for?", "Any news from Globex?")


class NameSpottingLLM:
    """Answers the extraction prompt with the demo's names found in the text."""

    def generate(self, prompt: str, max_tokens: int = 100) -> str:
        found = sorted((prompt.find(name), name) for name in NAMES if name in prompt)
        return ", ".join(name for _, name in found)


def run_demo(store: Store, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the demo conversation on ``store``, which holds zerda_store's schema (a SQLite
    file is created or upgraded here; the ``demo`` command creates the schema in an empty
    database of any backend first); what the session holds afterwards, and what this run
    stored and recalled."""
    with ConversationEntityMemory(
        NameSpottingLLM(), store=store, session_id=DEMO_SESSION
    ) as memory:
        earlier = len(memory.chat_memory)
        if earlier:
            echo(
                f"This memory already holds {plural(earlier, 'turn')} from earlier runs: "
                "it survived."
            )
        else:
            echo("A new, empty memory.")
        echo(f"Database: {memory.store}\n")
        stored_now: list[str] = []
        recalls: dict[str, str] = {}
        for number, (user, assistant) in enumerate(TURNS, 1):
            stored = len(memory.chat_memory)
            # A key per scripted turn: a later run delivers the same turns again, and the
            # memory stores each once, as it would a retried delivery.
            key = f"demo-turn-{number}"
            memory.save_context({"input": user}, {"output": assistant}, idempotency_key=key)
            echo(f"user:      {user}\nassistant: {assistant}")
            if len(memory.chat_memory) > stored:
                stored_now.append(key)
                echo(f"  -> remembered: {', '.join(memory.chat_memory[-1]['entities'])}\n")
            else:
                echo(f"  -> already stored by an earlier run (idempotency key {key!r})\n")
        for question in QUESTIONS:
            recalled = memory.load_memory_variables({"input": question})["entity_info"]
            recalls[question] = recalled
            echo(f"user asks: {question}\nthe memory recalls:\n{recalled}\n")
        stats = memory.get_memory_stats()
        echo(
            f"{plural(stats['entity_count'], 'entity')}, {plural(stats['message_count'], 'turn')}, "
            f"{plural(stats['total_contexts'], 'snippet')} stored in session {DEMO_SESSION!r}."
        )
    return {
        "session_id": DEMO_SESSION,
        "earlier_turns": earlier,
        "stored_now": stored_now,
        "recalled": recalls,
        "entities": stats["entity_count"],
        "turns": stats["message_count"],
        "snippets": stats["total_contexts"],
    }
