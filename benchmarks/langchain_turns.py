"""Section (g): a whole turn (load, then save) through zerda_store and through LangChain's
``ConversationEntityMemory`` with ``SQLiteEntityStore`` and ``SQLChatMessageHistory``.

LangChain's class calls its model once per load (entity extraction) and once per entity
per save (summaries), so it gets a model that answers at once: the turn's names for the
extraction prompt, a fixed sentence for a summary. Both memories write SQLite files in the
same folder; LangChain's with its own defaults (rollback journal, one commit per entity).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from .databases import Databases
from .report import Figure, ratio_figure
from .turns import ZerdaTurns
from .workload import Query, Turn, interleaved, make_turns

TARGET = 1 / 20
SUMMARY = "Asked for the signed renewal before Friday."


def langchain_missing() -> str | None:
    try:
        from langchain_classic.memory import ConversationEntityMemory  # noqa: F401
        from langchain_community.chat_message_histories import (  # noqa: F401
            SQLChatMessageHistory,
        )
    except ImportError as exc:
        return (
            f"{exc} (pip install -e '.[bench]' or langchain-classic langchain-community greenlet)"
        )
    return None


def _zero_cost_llm() -> Any:
    from langchain_core.language_models.llms import LLM

    class ZeroCostLLM(LLM):
        """Answers the extraction prompt with the names set in ``script``; any other
        prompt (a summary) with a fixed sentence."""

        script: dict[str, str]

        @property
        def _llm_type(self) -> str:
            return "zero-cost"

        def _call(self, prompt: str, stop: Any = None, run_manager: Any = None, **_: Any) -> str:
            if "keep track of facts" in prompt:
                return SUMMARY
            return self.script["names"]

    return ZeroCostLLM(script={"names": ""})


class LangChainTurns:
    def __init__(self, folder: str, session_id: str = "customer_1") -> None:
        from langchain_classic.memory import ConversationEntityMemory
        from langchain_classic.memory.entity import SQLiteEntityStore
        from langchain_community.chat_message_histories import SQLChatMessageHistory

        path = os.path.join(folder, "langchain.db")
        self.llm = _zero_cost_llm()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.entity_store = SQLiteEntityStore(session_id=session_id, db_file=path)
            self.history = SQLChatMessageHistory(
                session_id=session_id, connection=f"sqlite:///{path}"
            )
            self.memory = ConversationEntityMemory(
                llm=self.llm, entity_store=self.entity_store, chat_memory=self.history
            )

    def turn(self, turn: Turn, query: Query) -> None:
        self.llm.script["names"] = query.answer
        self.memory.load_memory_variables({"input": query.input_text})
        self.llm.script["names"] = turn.answer
        self.memory.save_context({"input": turn.input_text}, {"output": turn.output_text})

    def close(self) -> None:
        self.entity_store.conn.close()
        self.history.engine.dispose()


def _zerda_turn(zerda: ZerdaTurns, turn: Turn, query: Query) -> None:
    zerda.load(query)
    zerda.save(turn)


def whole_turns(dbs: Databases, turn_count: int, rounds: int) -> list[Figure]:
    """(g): per-turn time of load+save, zerda_store against LangChain, on SQLite."""
    zerda = ZerdaTurns(dbs.get("zerda"), "customer-3")
    langchain = LangChainTurns(dbs.folder)
    turns = make_turns(turn_count, seed=5)
    # The turn's own input names the entities it then saves, as in a real exchange.
    queries = [Query(turn.input_text, turn.names) for turn in turns]
    size = turn_count // rounds

    def block(who: Any) -> Any:
        def run(r: int) -> float:
            chunk = range(r * size, (r + 1) * size)
            started = time.perf_counter()
            for i in chunk:
                who(turns[i], queries[i])
            return (time.perf_counter() - started) / size

        return run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            samples = interleaved(
                {
                    "zerda": block(lambda t, q: _zerda_turn(zerda, t, q)),
                    "langchain": block(langchain.turn),
                },
                rounds,
            )
        finally:
            zerda.close()
            langchain.close()
    figure = ratio_figure(
        "g",
        "sqlite",
        f"whole turn (load + save), turns 1–{turn_count} of a conversation",
        samples["zerda"],
        samples["langchain"],
        "LangChain ConversationEntityMemory",
        note="LangChain re-reads the whole history twice a turn, so its time grows with the turn number",
    )
    figure.target = f"≤ 1/{round(1 / TARGET)} ({TARGET:.2f}×)"
    figure.met = figure.ratio is not None and figure.ratio <= TARGET
    return [figure]
