"""What the memory's sync calls (:mod:`conversation`), their awaitable twins
(:mod:`aio.conversation`) and its identity calls (:mod:`identity`) stand on: the
:class:`MemoryCore` holding the constructor, the parts it builds (repositories, policies,
views) and the private steps every call shares. It imports none of the classes built on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from sqlalchemy.engine import URL

from ..db.migration import migrate
from ..db.store import Store, StoreCore, core_of
from ..extraction import (
    DEFAULT_EXTRACTION_PROMPT,
    ExtractionResult,
    ExtractionService,
    Extractor,
    LLMExtractor,
    StanzaExtractor,
)
from ..identity.repository import IdentityRepository
from ..identity.rules import mention_of, mentions_in
from ..model.names import (
    UNKNOWN_TYPE,
    KeyRules,
    key_rules_for,
    without_ignorable_characters,
)
from ..model.records import EntityRecord, Mention, NewTurn, Outcome, SessionStats, turn_text
from ..model.templates import filler
from ..retention.policies import Policies, PolicyCache
from ..retention.policy import Visibility
from ..retention.pruning import Pruner
from ..telemetry.operations import note_saved
from ..turns.erasure import Erasure
from ..turns.ledger import Ledger
from ..turns.repository import Repository
from ..validation import (
    MAX_IDEMPOTENCY_KEY_LENGTH,
    checked_identifier,
    checked_session_id,
    checked_text,
    mapping_text,
)
from .views import ChatMemoryView, Entity, EntityStoreView

# Snippets recalled per entity.
RECALL_LIMIT = 3


def outcome(result: ExtractionResult) -> Outcome:
    """An extraction's outcome as the ledger records it."""
    return Outcome(result.extractor, result.status, result.error, result.latency)


def given_name(name: object, what: str = "entity name") -> str:
    """A name a caller gives (to look an entity up, change it, or name an alias): checked as
    text, then without the characters that change no letter (H12), as extraction cleans
    the names it finds, so that "Sarah" followed by a variation selector finds the entity a
    save stored as "Sarah", under any key rules. Its ends stay as given: under the
    original's exact keys "Sarah " is another name."""
    return without_ignorable_characters(checked_text(name, what))


def checked_key(idempotency_key: str | None) -> str | None:
    if idempotency_key is None:
        return None
    return checked_identifier(idempotency_key, "idempotency_key", MAX_IDEMPOTENCY_KEY_LENGTH)


def entity_info(
    details: tuple[EntityRecord, int, list[str], list[str]] | None,
) -> dict[str, Any] | None:
    """What :meth:`ConversationEntityMemory.get_entity_info` returns for these details."""
    if details is None:
        return None
    entity, count, recent, aliases = details
    return {
        "name": entity.name,
        "type": entity.entity_type,
        "contexts_count": count,
        "first_seen": entity.first_seen,
        "last_seen": entity.last_seen,
        "recent_contexts": recent,
        "aliases": aliases,
    }


DEFAULT_TEMPLATES = {"ar": "معلومات سابقة عن {name}:"}
ENGLISH_TEMPLATE = "Previous information about {name}:"


def default_entity_info_template(lang: str) -> str:
    """The header of one recalled entity's block for a language."""
    return DEFAULT_TEMPLATES.get(lang, ENGLISH_TEMPLATE)


@dataclass(frozen=True)
class MemoryParts:
    """What a memory runs on: its store and the repositories and policies over it. Built
    from the store (:meth:`on`) unless given, as a test gives fakes of them."""

    store: StoreCore
    repository: Repository
    identity: IdentityRepository
    erasure: Erasure
    ledger: Ledger
    policies: Policies
    policy: PolicyCache

    @classmethod
    def on(
        cls,
        store: StoreCore,
        key_rules: KeyRules,
        session_id: str,
        *,
        auto_migrate: bool | None = None,
        close_on_failure: bool = False,
    ) -> MemoryParts:
        """The parts of a memory of ``session_id`` on ``store``, its schema checked (or
        brought to the head revision, see :func:`migrate.ensure_schema`) first."""
        try:
            migrate.ensure_schema(store, auto_migrate)
        except BaseException:
            if close_on_failure:
                store.close()
            raise
        repository = Repository(store, key_rules)
        policies = Policies(store)
        return cls(
            store,
            repository,
            IdentityRepository(store, key_rules),
            Erasure(store),
            Ledger(store, repository.resolver),
            policies,
            PolicyCache(policies, session_id),
        )


class MemoryCore:
    """The constructor and the private steps of :class:`ConversationEntityMemory`; the
    classes of its public calls stand on it."""

    def __init__(
        self,
        llm: Any = None,
        memory_key: str = "entity_info",
        input_key: str = "input",
        output_key: str = "output",
        lang: str = "en",
        entity_extraction_prompt: str | None = None,
        *,
        database_url: str | URL | None = None,
        session_id: str = "default",
        store: Store | None = None,
        normalize_names: bool = True,
        merge_lowercase_words: bool = False,
        entity_info_template: str | None = None,
        extractor: Extractor | None = None,
        auto_migrate: bool | None = None,
        clock: Callable[[], float] = time.time,
        parts: MemoryParts | None = None,
    ) -> None:
        if store is not None and database_url is not None:
            raise ValueError("pass either database_url or store, not both")
        self.session_id = checked_session_id(session_id)
        self.llm = llm
        self.memory_key = memory_key
        self.input_key = input_key
        self.output_key = output_key
        self.lang = lang
        self.entity_extraction_prompt = entity_extraction_prompt or DEFAULT_EXTRACTION_PROMPT
        self.normalize_names = normalize_names
        self.key_rules = key_rules_for(
            normalize_names=normalize_names, merge_lowercase_words=merge_lowercase_words
        )
        self.entity_info_template = entity_info_template or default_entity_info_template(lang)
        self._extractor = extractor
        self._llm_extractor: LLMExtractor | None = None  # made for self.llm and the prompt
        self._clock = clock
        self._extraction = ExtractionService(extractor)
        if parts is None:
            self._owns_store = store is None
            if store is None:
                store = Store(database_url)
            parts = MemoryParts.on(
                core_of(store),
                self.key_rules,
                self.session_id,
                auto_migrate=auto_migrate,
                close_on_failure=self._owns_store,
            )
        else:
            self._owns_store = False
        # The store the memory was given or opened (``memory.store``), and the core it runs on.
        self.store: Store | StoreCore = store if store is not None else parts.store
        self._store = parts.store
        self._repository = parts.repository
        self._identity = parts.identity
        self._erasure = parts.erasure
        self._ledger = parts.ledger
        self._policies = parts.policies
        self._policy = parts.policy
        self._policy.get()  # the store's policy cache, read now rather than inside a call
        self.entity_store: Mapping[str, Entity] = EntityStoreView(
            self._repository,
            self.session_id,
            self._now,
            self._visible,
            self._named,
            self._check_key_rules,
        )
        self.chat_memory: Sequence[dict[str, Any]] = ChatMemoryView(
            self._repository, self.session_id, self._visible
        )

    def __repr__(self) -> str:
        return f"ConversationEntityMemory(session_id={self.session_id!r}, store={self.store!r})"

    def _now(self) -> float:
        """Seconds since the epoch (by the memory's clock), as ``first_seen`` and
        ``last_seen`` record them."""
        return self._clock()

    def _visible(self) -> Visibility | None:
        """What reads may show now under the session's policy; None without one (reads
        are then the plain ones). The policy is cached (``POLICY_CACHE_SECONDS``)."""
        policy = self._policy.get()
        if policy is None:
            return None
        return self._policies.visibility(self.session_id, policy, self._now())

    def _expire_if_idle(self) -> None:
        """Before a save: a session idle past its ``session_idle`` is pruned first, so the
        new turn does not bring what expired back into view."""
        policy = self._policy.get()
        if policy is None:
            return
        if self._policies.visibility(self.session_id, policy, self._now()).idle_expired:
            self._pruner().prune(self.session_id)

    def _pruner(self) -> Pruner:
        return Pruner(self._store, now=self._now)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the database connections (of a store this memory opened). Data stays."""
        if self._owns_store:
            self._store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- extraction -----------------------------------------------------------------------

    def _current_extractor(self) -> Extractor:
        if self._extractor is not None:
            return self._extractor
        if not self.llm:
            return StanzaExtractor.shared(self.lang)
        made, prompt = self._llm_extractor, self.entity_extraction_prompt
        if made is None or made.llm is not self.llm or made.prompt != prompt:
            made = self._llm_extractor = LLMExtractor(self.llm, prompt)
        return made

    def _extract(self, text: str) -> ExtractionResult:
        return self._extraction.extract(text, self._current_extractor())

    def _extract_entities(self, text: str) -> list[str]:
        """Entity names in ``text``, as the original returned them; never raises."""
        return self._extract(text).names

    def _mentions(self, result: ExtractionResult) -> list[Mention]:
        """One mention per entity, in extraction order: the first form of the name, and
        the first type known for it."""
        return mentions_in(result.entities, self.key_rules)

    def _mention(self, name: str, entity_type: str = UNKNOWN_TYPE) -> Mention:
        """``name`` as a mention: its key, core and markers under the memory's rules."""
        return mention_of(name, self.key_rules, entity_type)

    def _texts(self, inputs: object, outputs: object) -> tuple[str, str]:
        return (
            mapping_text(inputs, self.input_key, "inputs"),
            mapping_text(outputs, self.output_key, "outputs"),
        )

    def _turn(self, inputs: object, outputs: object, idempotency_key: str | None) -> NewTurn:
        self._store.check_writable()  # before extraction: no model call for a refused write
        texts = self._texts(inputs, outputs)
        return self._new_turn(texts, self._extract(turn_text(*texts)), idempotency_key)

    def _new_turn(
        self, texts: tuple[str, str], result: ExtractionResult, idempotency_key: str | None
    ) -> NewTurn:
        input_text, output_text = texts
        mentions = self._mentions(result)
        note_saved(input_text, output_text, mentions)
        return NewTurn(
            input_text,
            output_text,
            mentions,
            self._now(),
            idempotency_key,
            outcome(result),
        )

    def _variables(self, recalled: list[tuple[str, list[str]]]) -> dict[str, Any]:
        heading = filler(self.entity_info_template, "name")
        blocks = [
            heading(name) + "\n" + "\n".join(snippets) for name, snippets in recalled if snippets
        ]
        return {self.memory_key: "\n\n".join(blocks)}

    def _stats(self, stats: SessionStats) -> dict[str, Any]:
        return {
            "type": "ConversationEntityMemory",
            "entity_count": stats.entity_count,
            "message_count": stats.message_count,
            "total_contexts": stats.total_contexts,
            "extraction_errors": self._extraction.error_count,
            "last_extraction_error": self._extraction.last_error,
        }

    def _key(self, name: str) -> str:
        return self.key_rules.key(given_name(name))

    def _named(self, name: str) -> Mention:
        return self._mention(given_name(name))

    def _check_key_rules(self) -> None:
        """Before a read or a change by name: the session's key rules must be this
        memory's, as a save checks (KeyRulesMismatchError); once per store and session."""
        check = self._repository.key_rules_check(self.session_id)
        if check is not None:
            self._store.read(check)

    def _find(self, name: str) -> EntityRecord | None:
        self._check_key_rules()
        return self._repository.find_entity(self.session_id, self._named(name), self._visible())


def store_core(memory: MemoryCore) -> StoreCore:
    """The core of the store a memory runs on: what its operations are observed on (the
    store's telemetry settings, its pool's gauges), whichever store the user holds."""
    return memory._store
