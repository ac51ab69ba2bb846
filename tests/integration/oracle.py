"""Scripted conversations run through the original class and through zerda_store, and the
snapshot of everything their public API shows afterwards.

Run as ``python -m tests.integration.oracle DATABASE_URL SESSION...`` it opens the given
database in a new process and prints the snapshot of each session (named after one of
``SESSIONS``) as one JSON object.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from tests.doubles import KeywordLLM

ORIGINAL_STATS_KEYS = ("type", "entity_count", "message_count", "total_contexts")
ARABIC_PREFIX = "معلومات سابقة عن "
ENGLISH_PREFIX = "Previous information about "


@dataclass(frozen=True)
class Conversation:
    vocabulary: tuple[str, ...]
    turns: tuple[tuple[dict[str, Any], dict[str, Any]], ...]
    queries: tuple[str, ...]
    lookups: tuple[str, ...]

    def llm(self) -> KeywordLLM:
        return KeywordLLM(self.vocabulary)


def _turn(said: str, answered: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"input": said}, {"output": answered}


ENGLISH = Conversation(
    vocabulary=("Sarah", "sarah", "Acme Corp", "Zed Labs", "Bob", "Paris", "Yara", "Al"),
    turns=(
        _turn("Sarah just joined Acme Corp as an engineer.", "Got it, noted!"),
        _turn("Zed Labs hired Bob in Paris.", "Bob will like Paris."),
        _turn("Yara met Sarah yesterday.", "And Al?"),
        _turn("sarah called about the invoice.", "I will tell Acme Corp."),
        _turn("The weather is nice.", "Indeed."),
        _turn("Sarah renewed the contract.", "Great."),
        _turn("Sarah and Bob talked at Acme Corp.", ""),
        _turn("", ""),
        _turn("Sarah asked for a discount.", "Offered five percent."),
    ),
    queries=(
        "What do we know about Sarah?",
        "Tell me about Bob and Zed Labs.",
        "Anything on sarah?",
        "Is Paris, Yara or Sarah relevant?",
        "Who is Nobody?",
        "",
        "Al and Acme Corp",
    ),
    lookups=("Sarah", "sarah", "SARAH", "Acme Corp", "Zed Labs", "Bob", "Paris", "Yara", "Al"),
)

ARABIC = Conversation(
    vocabulary=("أحمد", "سارة", "شركة النور", "القاهرة", "ليلى", "دبي"),
    turns=(
        _turn("انضم أحمد إلى شركة النور في القاهرة.", "تم التسجيل."),
        _turn("ليلى تعمل في دبي.", "حسناً."),
        _turn("سارة اتصلت بخصوص أحمد.", "سأبلغ شركة النور."),
        _turn("الطقس جميل اليوم.", "نعم."),
        _turn("أحمد جدد العقد.", "ممتاز."),
        _turn("أحمد طلب خصماً.", "عرضنا خمسة بالمئة على أحمد."),
        _turn("Ahmed أحمد visited دبي", "ok"),
    ),
    queries=(
        "ماذا نعرف عن أحمد؟",
        "أخبرني عن دبي وليلى.",
        "هل سارة أو شركة النور مهمتان؟",
        "من هو خالد؟",
        "",
    ),
    lookups=("أحمد", "سارة", "شركة النور", "القاهرة", "ليلى", "دبي", "احمد"),
)

CONVERSATIONS = {"english": ENGLISH, "arabic": ARABIC}


def play(memory: Any, conversation: Conversation) -> None:
    for inputs, outputs in conversation.turns:
        memory.save_context(inputs, outputs)


def snapshot(memory: Any, conversation: Conversation) -> dict[str, Any]:
    """What the public API shows; entity info keeps its timestamps."""
    stats = memory.get_memory_stats()
    return {
        "entities": memory.list_entities(),
        "info": {name: memory.get_entity_info(name) for name in conversation.lookups},
        "stats": {key: stats[key] for key in ORIGINAL_STATS_KEYS},
        "chat_memory": [dict(turn) for turn in memory.chat_memory],
        "recall": [memory.load_memory_variables({"input": q}) for q in conversation.queries],
    }


def without_times(state: dict[str, Any]) -> dict[str, Any]:
    info = {
        name: None
        if details is None
        # The original has no aliases: an entity with none compares equal.
        else {
            k: v
            for k, v in details.items()
            if k not in ("first_seen", "last_seen") and (k, v) != ("aliases", [])
        }
        for name, details in state["info"].items()
    }
    return {**state, "info": info}


def with_english_headers(state: dict[str, Any]) -> dict[str, Any]:
    """The original's state with this project's English recall header."""
    recall = [
        {key: text.replace(ARABIC_PREFIX, ENGLISH_PREFIX) for key, text in variables.items()}
        for variables in state["recall"]
    ]
    return {**state, "recall": recall}


def run_original(conversation: Conversation) -> dict[str, Any]:
    from zerda.memory import ConversationEntityMemory as Original

    memory = Original(llm=conversation.llm())
    play(memory, conversation)
    return snapshot(memory, conversation)


# session id -> (conversation, lang, normalize_names)
SESSIONS = {
    "english-en": ("english", "en", False),
    "english-ar": ("english", "ar", False),
    "arabic-ar": ("arabic", "ar", False),
    "arabic-normalized": ("arabic", "ar", True),
}


def open_store(database_url: str, session_id: str) -> Any:
    from zerda_store import ConversationEntityMemory

    name, lang, normalize = SESSIONS[session_id]
    return ConversationEntityMemory(
        llm=CONVERSATIONS[name].llm(),
        lang=lang,
        database_url=database_url,
        session_id=session_id,
        normalize_names=normalize,
    )


def main(argv: list[str]) -> None:
    database_url, *session_ids = argv
    states = {}
    for session_id in session_ids:
        with open_store(database_url, session_id) as memory:
            states[session_id] = snapshot(memory, CONVERSATIONS[SESSIONS[session_id][0]])
    print(json.dumps(states, ensure_ascii=False))


if __name__ == "__main__":
    main(sys.argv[1:])
