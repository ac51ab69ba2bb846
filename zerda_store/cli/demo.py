"""A short scripted CRM conversation that shows what the memory recalls.

The stand-in LLM answers the extraction prompt by spotting a fixed list of names, so the
demo runs offline and costs nothing. Run it twice: the second run starts from what the
first one stored.
"""

from __future__ import annotations

from collections.abc import Callable

from ..db.engine import Store
from ..memory.conversation import ConversationEntityMemory

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


def run_demo(store: Store, echo: Callable[[str], None] = print) -> None:
    """Run the demo conversation on ``store`` (its schema created or upgraded if needed)."""
    with ConversationEntityMemory(
        NameSpottingLLM(), store=store, session_id=DEMO_SESSION
    ) as memory:
        earlier = len(memory.chat_memory)
        if earlier:
            echo(f"This memory already holds {earlier} turns from earlier runs: it survived.")
        else:
            echo("A new, empty memory.")
        echo(f"Database: {memory.store}\n")
        for user, assistant in TURNS:
            memory.save_context({"input": user}, {"output": assistant})
            echo(f"user:      {user}\nassistant: {assistant}")
            echo(f"  -> remembered: {', '.join(memory.chat_memory[-1]['entities'])}\n")
        for question in QUESTIONS:
            recalled = memory.load_memory_variables({"input": question})["entity_info"]
            echo(f"user asks: {question}\nthe memory recalls:\n{recalled}\n")
        stats = memory.get_memory_stats()
        echo(
            f"{stats['entity_count']} entities, {stats['message_count']} turns, "
            f"{stats['total_contexts']} snippets stored in session {DEMO_SESSION!r}."
        )
