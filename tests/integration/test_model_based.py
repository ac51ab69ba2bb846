"""Model-based test: random sequences of calls on zerda_store and on the original in-memory
class (the model) give the same observable results, on SQLite and on Postgres.

Hypothesis drives two sessions (each with its own key names and its own original
instance as the model) through save_context / asave_context, load_memory_variables /
aload_memory_variables, _extract_entities, get_entity_info, list_entities, entity_store,
chat_memory (whole, by index, by slice), get_memory_stats, clear, and close-and-reopen
(a new ConversationEntityMemory on the same database, by URL or through a shared Store),
and compares every result after every step.

The documented differences are kept out of the comparison, or accounted for:
- ``normalize_names=False`` and ``entity_info_template`` set to the original's header, so
  names and recall text are the original's;
- the model LLM names each vocabulary word at most once per prompt, so no turn and no query
  lists a name twice (where zerda_store would dedupe and the original would not);
- for blank text zerda_store asks no model; the original asks, and the model LLM answers
  nothing. Every prompt the original sends about non-blank text must reach zerda_store's
  LLM too, verbatim and with the same ``max_tokens``;
- timestamps are compared with the wall clock, not with the original's: ``first_seen`` lies
  between the call that first named the entity and ``last_seen``, ``last_seen`` is not older
  than the last call that named it, ``first_seen`` never changes and ``last_seen`` never goes
  back while the entity exists.

A fresh database per example would be too slow on Postgres, so every example gets fresh
session ids on the test's database instead; sessions are isolated, so this is equivalent.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from zerda.memory import ConversationEntityMemory as Original

from tests.doubles import KeywordLLM, RecordingLLM
from tests.integration.oracle import ORIGINAL_STATS_KEYS
from zerda_store import ConversationEntityMemory, Store

ORIGINAL_TEMPLATE = "معلومات سابقة عن {name}:"
ORIGINAL_PROMPT = Original().entity_extraction_prompt

# Case variants, Arabic spelling variants, overlapping names ("Acme" / "Acme Corp"), a name
# the original's length filter drops ("Al"), and names whose sorted order differs from the
# order they are mentioned in.
VOCABULARY = (
    "Sarah",
    "sarah",
    "Zed Labs",
    "Bob",
    "Acme Corp",
    "Acme",
    "Émile",
    "Al",
    "أحمد",
    "احمد",
    "أَحمد",
    "ليلى",
    "شركة النور",
)
FILLER = ("met", "called about the invoice", "ok", "في", "اتصل اليوم", "and", "؟")
SEPARATORS = (" ", ", ", ". ", "\n", " و ", "! ")
LOOKUPS = (*VOCABULARY, "SARAH", "Sarah ", "acme corp", "Zed", "Nobody", "")

# Session 0 keeps the original's keys; session 1 renames them and uses another lang
# (the template still gives the original's header).
SESSION_OPTIONS = (
    {"lang": "en"},
    {"lang": "ar", "memory_key": "history", "input_key": "question", "output_key": "answer"},
)
SESSIONS = st.integers(0, len(SESSION_OPTIONS) - 1)

texts = st.builds(
    lambda padding, words, separator: padding + separator.join(words) + padding,
    st.sampled_from(("", "", "", " ", "\n\t ")),
    st.lists(st.sampled_from(VOCABULARY + FILLER), max_size=5),
    st.sampled_from(SEPARATORS),
)
# Turns that name someone: one to three distinct vocabulary names among some filler.
# Half the names come from a few regulars, so that some entities gather many snippets.
mentioned_names = st.sampled_from(("Sarah", "Bob", "أحمد")) | st.sampled_from(VOCABULARY)
naming_texts = st.builds(
    lambda names, filler, separator: separator.join(names + filler),
    st.lists(mentioned_names, min_size=1, max_size=3, unique=True),
    st.lists(st.sampled_from(FILLER), max_size=2),
    st.sampled_from(SEPARATORS),
)
# Mostly the key is there; sometimes the text sits under an unrelated key (a missing key).
key_present = st.sampled_from((True, True, True, False))


@dataclass
class Session:
    options: dict[str, str]
    session_id: str
    theirs: Original
    their_llm: RecordingLLM
    ours: ConversationEntityMemory
    our_llm: RecordingLLM
    # name -> [time before the call that first named it, time before the last such call]
    named_since: dict[str, list[float]] = field(default_factory=dict)
    # name -> (first_seen, last_seen) as last observed
    observed: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def input_key(self) -> str:
        return self.options.get("input_key", "input")

    @property
    def output_key(self) -> str:
        return self.options.get("output_key", "output")


def without_times(info: dict[str, Any] | None) -> dict[str, Any] | None:
    if info is None:
        return None
    # The original has no aliases: an entity with none compares equal.
    return {
        k: v
        for k, v in info.items()
        if k not in ("first_seen", "last_seen") and (k, v) != ("aliases", [])
    }


class MemoryMachine(RuleBasedStateMachine):
    database_url: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.store: Store | None = None
        self.opened: list[ConversationEntityMemory] = []
        self.sessions: list[Session] = []
        for options in SESSION_OPTIONS:
            session_id, their_llm, our_llm = (
                f"model-{uuid.uuid4()}",
                RecordingLLM(KeywordLLM(VOCABULARY)),
                RecordingLLM(KeywordLLM(VOCABULARY)),
            )
            ours = self._open(options, session_id, our_llm, shared_store=False)
            theirs = Original(llm=their_llm, **options)
            self.sessions.append(Session(options, session_id, theirs, their_llm, ours, our_llm))

    def _open(
        self, options: dict[str, str], session_id: str, llm: RecordingLLM, *, shared_store: bool
    ) -> ConversationEntityMemory:
        """zerda_store's memory of one session, on its own engine or on the shared store."""
        where: dict[str, Any] = {"database_url": self.database_url}
        if shared_store:
            if self.store is None:
                self.store = Store(self.database_url)
            where = {"store": self.store}
        memory = ConversationEntityMemory(
            llm,
            **options,
            **where,
            session_id=session_id,
            normalize_names=False,
            entity_info_template=ORIGINAL_TEMPLATE,
        )
        self.opened.append(memory)
        return memory

    def teardown(self) -> None:
        for memory in self.opened:
            memory.close()
        if self.store is not None:
            self.store.close()

    # -- checks ---------------------------------------------------------------------------

    def _check_prompts(self, session: Session, text: str) -> None:
        """Both LLMs were asked about the text alike; zerda_store skips blank text."""
        theirs, ours = session.their_llm.calls, session.our_llm.calls
        assert theirs == [(ORIGINAL_PROMPT.format(text=text), 100)]
        assert ours == (theirs if text.strip() else [])
        theirs.clear()
        ours.clear()

    def _check_times(self, session: Session, name: str, info: dict[str, Any]) -> None:
        first_seen, last_seen = info["first_seen"], info["last_seen"]
        assert isinstance(first_seen, float) and isinstance(last_seen, float)
        assert first_seen <= last_seen <= time.time()
        first_named, last_named = session.named_since[info["name"]]
        assert first_named <= first_seen
        assert last_named <= last_seen
        if name in session.observed:
            earlier_first, earlier_last = session.observed[name]
            assert first_seen == earlier_first
            assert last_seen >= earlier_last
        session.observed[name] = (first_seen, last_seen)

    def _draw_name(self, session: Session, data: st.DataObject) -> str:
        """A name the model knows, or any of the lookups (variants, unknown names)."""
        names = st.sampled_from(LOOKUPS)
        known = session.theirs.list_entities()
        if known:
            names = st.sampled_from(known) | names
        return data.draw(names, label="name")

    # -- writes ---------------------------------------------------------------------------

    def _save(
        self, s: int, said: str, answered: str, with_input: bool, with_output: bool, use_async: bool
    ) -> None:
        session = self.sessions[s]
        inputs = {session.input_key if with_input else "unrelated": said}
        outputs = {session.output_key if with_output else "unrelated": answered}
        before = time.time()
        for memory in (session.theirs, session.ours):
            if use_async:
                asyncio.run(memory.asave_context(dict(inputs), dict(outputs)))
            else:
                memory.save_context(dict(inputs), dict(outputs))
        self._check_prompts(
            session, f"{said if with_input else ''} {answered if with_output else ''}"
        )
        for name in session.theirs.chat_memory[-1]["entities"]:
            session.named_since.setdefault(name, [before, before])[1] = before

    @initialize(turns=st.lists(st.tuples(SESSIONS, naming_texts, texts), max_size=6))
    def start_with_some_turns(self, turns: list[tuple[int, str, str]]) -> None:
        for s, said, answered in turns:
            self._save(s, said, answered, True, True, False)

    @rule(
        s=SESSIONS,
        said=texts,
        answered=texts,
        with_input=key_present,
        with_output=key_present,
        use_async=st.booleans(),
    )
    def save_context(
        self, s: int, said: str, answered: str, with_input: bool, with_output: bool, use_async: bool
    ) -> None:
        self._save(s, said, answered, with_input, with_output, use_async)

    @rule(s=SESSIONS, said=naming_texts, answered=texts)
    def save_context_naming_someone(self, s: int, said: str, answered: str) -> None:
        self._save(s, said, answered, True, True, False)

    @precondition(lambda self: sum(len(s.theirs.chat_memory) for s in self.sessions) >= 6)
    @rule(s=SESSIONS)
    def clear(self, s: int) -> None:
        session = self.sessions[s]
        session.theirs.clear()
        session.ours.clear()
        session.named_since.clear()
        session.observed.clear()
        assert session.ours.list_entities() == []
        assert len(session.ours.chat_memory) == 0

    @rule(s=SESSIONS, shared_store=st.booleans())
    def close_and_reopen(self, s: int, shared_store: bool) -> None:
        session = self.sessions[s]
        reopened = self._open(
            session.options, session.session_id, session.our_llm, shared_store=shared_store
        )
        session.ours.close()
        session.ours = reopened

    # -- reads ----------------------------------------------------------------------------

    @rule(s=SESSIONS, query=texts | naming_texts, with_input=key_present, use_async=st.booleans())
    def load_memory_variables(self, s: int, query: str, with_input: bool, use_async: bool) -> None:
        session = self.sessions[s]
        inputs = {session.input_key if with_input else "unrelated": query}
        results = [
            asyncio.run(memory.aload_memory_variables(dict(inputs)))
            if use_async
            else memory.load_memory_variables(dict(inputs))
            for memory in (session.theirs, session.ours)
        ]
        assert results[1] == results[0]
        self._check_prompts(session, query if with_input else "")

    @rule(s=SESSIONS, text=texts | naming_texts)
    def extract_entities(self, s: int, text: str) -> None:
        session = self.sessions[s]
        assert session.ours._extract_entities(text) == session.theirs._extract_entities(text)
        self._check_prompts(session, text)

    @rule(s=SESSIONS, data=st.data())
    def get_entity_info(self, s: int, data: st.DataObject) -> None:
        session = self.sessions[s]
        name = self._draw_name(session, data)
        ours, theirs = session.ours.get_entity_info(name), session.theirs.get_entity_info(name)
        assert without_times(ours) == without_times(theirs)
        if ours is not None:
            self._check_times(session, name, ours)

    @rule(s=SESSIONS)
    def list_entities(self, s: int) -> None:
        session = self.sessions[s]
        assert session.ours.list_entities() == session.theirs.list_entities()

    @rule(s=SESSIONS, data=st.data(), limit=st.integers(1, 4))
    def entity_store(self, s: int, data: st.DataObject, limit: int) -> None:
        session = self.sessions[s]
        name = self._draw_name(session, data)
        ours, theirs = session.ours.entity_store, session.theirs.entity_store
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)
        assert (name in ours) == (name in theirs)
        if name in theirs:
            mine, model = ours[name], theirs[name]
            assert (mine.name, mine.entity_type) == (model.name, model.entity_type)
            assert mine.contexts == model.contexts
            assert mine.get_recent_contexts(limit) == model.get_recent_contexts(limit)
            times = {"first_seen": mine.first_seen, "last_seen": mine.last_seen}
            self._check_times(session, name, {"name": mine.name, **times})
        else:
            with pytest.raises(KeyError):
                ours[name]

    @rule(
        s=SESSIONS,
        index=st.integers(-6, 6),
        window=st.tuples(
            st.none() | st.integers(-6, 6),
            st.none() | st.integers(-6, 6),
            st.none() | st.sampled_from((1, 2, -1, -2)),
        ),
    )
    def chat_memory(
        self, s: int, index: int, window: tuple[int | None, int | None, int | None]
    ) -> None:
        session = self.sessions[s]
        ours, theirs = session.ours.chat_memory, session.theirs.chat_memory
        assert len(ours) == len(theirs)
        assert list(ours) == theirs
        if -len(theirs) <= index < len(theirs):
            assert ours[index] == theirs[index]
        else:
            with pytest.raises(IndexError):
                ours[index]
        assert ours[slice(*window)] == theirs[slice(*window)]

    @rule(s=SESSIONS)
    def get_memory_stats(self, s: int) -> None:
        session = self.sessions[s]
        ours, theirs = session.ours.get_memory_stats(), session.theirs.get_memory_stats()
        assert {key: ours[key] for key in ORIGINAL_STATS_KEYS} == theirs
        assert (ours["extraction_errors"], ours["last_extraction_error"]) == (0, None)


MODEL_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_the_model_llm_finds_no_name_in_the_prompt_itself() -> None:
    """Blank text gives no names from the original either, so skipping the call is safe."""
    assert KeywordLLM(VOCABULARY).generate(ORIGINAL_PROMPT.format(text="")) == ""
    assert KeywordLLM(VOCABULARY).generate(ORIGINAL_PROMPT.format(text=" \n\t ")) == ""


@pytest.mark.slow
def test_random_call_sequences_give_the_originals_results(database_url: str) -> None:
    machine = type("Machine", (MemoryMachine,), {"database_url": database_url})
    run_state_machine_as_test(machine, settings=MODEL_SETTINGS)
