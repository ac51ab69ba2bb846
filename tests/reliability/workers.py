"""Code that runs in child processes of the concurrency suite (started with ``spawn``,
so it lives in an importable module, not in a test file)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import sqlalchemy as sa

from tests.doubles import VocabularyExtractor, direct_url
from tests.reliability.helpers import VOCABULARY, turn_input, turn_names
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.schema import contexts, turns


class _RetryCounter(logging.Handler):
    """Counts the write transactions the store had to run again (deadlocks and the like)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.count += 1


def _snippet_entity_ids(observer: sa.Engine, session_id: str, input_text: str) -> list[int]:
    """The entity ids this process's upserts returned for one of its turns, as stored."""
    query = (
        sa.select(contexts.c.entity_id)
        .join(turns, turns.c.id == contexts.c.turn_id)
        .where(turns.c.session_id == session_id, turns.c.input_text == input_text)
    )
    with observer.connect() as connection:
        return sorted(connection.execute(query).scalars())


def save_turns(
    url: str,
    session_id: str,
    worker: int,
    threads: int,
    turns_per_thread: int,
    note_every: int,
    start: Any,
    results: Any,
) -> None:
    """Save turns from ``threads`` threads sharing one memory, each turn preceded by a read
    (recall) and every ``note_every``-th followed by ``Entity.add_context`` (a transaction
    that reads before it writes). Puts a report on ``results``."""
    retries = _RetryCounter()
    logging.getLogger("zerda_store").addHandler(retries)
    store = Store(url)
    memory = ConversationEntityMemory(
        extractor=VocabularyExtractor(VOCABULARY),
        store=store,
        session_id=session_id,
        auto_migrate=False,
    )
    observer = sa.create_engine(direct_url(url))
    errors: list[str] = []
    observed: dict[str, list[int]] = {}
    notes: list[str] = []
    in_step = threading.Barrier(threads)

    def run(thread: int) -> None:
        in_step.wait()
        for i in range(turns_per_thread):
            names = turn_names(worker, thread * turns_per_thread + i)
            tag = f"w{worker}-t{thread}-{i}"
            text = turn_input(tag, names)
            try:
                memory.load_memory_variables({"input": text})
                memory.save_context({"input": text}, {"output": "Noted."})
                if i % note_every == 0:
                    memory.entity_store[names[0]].add_context(f"note {tag}")
                    notes.append(tag)
                observed[tag] = _snippet_entity_ids(observer, session_id, text)
            except Exception as exc:
                errors.append(f"{tag}: {type(exc).__name__}: {exc}")

    start.wait()
    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    memory.close()
    store.close()
    observer.dispose()
    results.put(
        {
            "worker": worker,
            "errors": errors,
            "observed": observed,
            "notes": len(notes),
            "retries": retries.count,
        }
    )
