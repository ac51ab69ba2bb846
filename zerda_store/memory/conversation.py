"""The persistent ConversationEntityMemory: the original class API over SQL tables.

Each call validates its input, runs extraction outside any transaction, then makes one
repository call. No SQL lives here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import URL

from ..db import migrate
from ..db.engine import Store
from ..db.schema import ANY_SCOPE
from ..db.validation import (
    checked_session_id,
    checked_text,
    mapping_text,
)
from ..extraction import (
    DEFAULT_EXTRACTION_PROMPT,
    ExtractionResult,
    ExtractionService,
    Extractor,
    LLMExtractor,
    StanzaExtractor,
)
from ..identity.repository import IdentityRepository
from ..identity.resolution import KeyRulesMismatchError
from ..identity.rules import identify
from ..model.names import EXACT, FOLD_V2, FOLD_V2_CASELESS, UNKNOWN_TYPE, key_rules_for
from ..model.records import (
    EntityRecord,
    ForgetReceipt,
    Mention,
    NewTurn,
    SessionStats,
    turn_text,
)
from ..retention.cache import PolicyCache
from ..retention.policies import Policies, Visibility, describe, make_rule
from ..retention.pruning import Pruner
from ..turns.erasure import Erasure
from ..turns.ledger import Ledger
from ..turns.repository import Repository
from .base import RECALL_LIMIT, checked_key, entity_info, outcome
from .conversation_aio import AsyncMemory
from .identity import IdentityMethods
from .views import ChatMemoryView, Entity, EntityStoreView

DEFAULT_TEMPLATES = {"ar": "معلومات سابقة عن {name}:"}
ENGLISH_TEMPLATE = "Previous information about {name}:"


def default_entity_info_template(lang: str) -> str:
    """The header of one recalled entity's block for a language."""
    return DEFAULT_TEMPLATES.get(lang, ENGLISH_TEMPLATE)


class ConversationEntityMemory(IdentityMethods, AsyncMemory):
    """Entity memory for a chat assistant, kept in SQLite or Postgres.

    The original's constructor arguments come first, in the same order; the keyword-only
    ones choose the database (``database_url`` or a shared ``store``), the conversation
    (``session_id``) and the deliberate differences from the original. Every call has an
    awaitable twin (``asave_context``, ``aload_memory_variables``, ...: :class:`AsyncMemory`).
    """

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
        self._extraction = ExtractionService(extractor)
        self._owns_store = store is None
        self.store = store if store is not None else Store(database_url)
        try:
            migrate.ensure_schema(self.store, auto_migrate)
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise
        self._repository = Repository(self.store, self.key_rules)
        self._identity = IdentityRepository(self.store, self.key_rules)
        self._erasure = Erasure(self.store)
        self._ledger = Ledger(self.store, self._repository.resolver)
        self._policies = Policies(self.store)
        self._policy = PolicyCache(self._policies, self.session_id)
        self._policy.get()  # the store's policy cache, read now rather than inside a call
        self.entity_store: Mapping[str, Entity] = EntityStoreView(self)
        self.chat_memory: Sequence[dict[str, Any]] = ChatMemoryView(self)

    def __repr__(self) -> str:
        return f"ConversationEntityMemory(session_id={self.session_id!r}, store={self.store!r})"

    @staticmethod
    def _now() -> float:
        """Seconds since the epoch, as ``first_seen``/``last_seen`` record them."""
        return time.time()

    @classmethod
    def for_session(cls, store: Store, session_id: str, **options: Any) -> ConversationEntityMemory:
        """A memory on an existing session with the session's own key mode: a session
        written with ``normalize_names=False`` has keys that are not normalized (it may hold
        both "Sarah" and "sarah"), and its names then match exactly."""
        recorded = Repository(store).key_rules(checked_session_id(session_id))
        if recorded is not None and recorded not in (EXACT, FOLD_V2, FOLD_V2_CASELESS):
            raise KeyRulesMismatchError(
                f"session {session_id!r} is keyed with the {recorded.name!r} key rules, which "
                "this version no longer writes: run `zerda-store db upgrade` to re-key it"
            )
        return cls(
            store=store,
            session_id=session_id,
            normalize_names=recorded is not EXACT,
            merge_lowercase_words=recorded is FOLD_V2_CASELESS,
            **options,
        )

    # -- retention ------------------------------------------------------------------------

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
        if policy is None or policy.general.session_idle is None:
            return
        if self._policies.visibility(self.session_id, policy, self._now()).idle_expired:
            self._pruner().prune(self.session_id)

    def _pruner(self) -> Pruner:
        return Pruner(self.store, now=self._now)

    def set_retention(
        self,
        keep_last: int | None = None,
        max_age: timedelta | float | None = None,
        session_idle: timedelta | float | None = None,
        *,
        entity_type: str | None = None,
    ) -> None:
        """Set this session's retention rule (for every entity type, or for one): keep the
        last ``keep_last`` snippets per entity, drop snippets (and, for every type, turns)
        older than ``max_age``, expire the whole session idle for ``session_idle``
        (timedelta or seconds). Replaces the rule of the same scope; reads hide what it
        expires at once, :meth:`prune` deletes it."""
        rule = make_rule(keep_last, max_age, session_idle)
        scope_type = ANY_SCOPE if entity_type is None else checked_text(entity_type, "entity_type")
        self._policies.set(self.session_id, scope_type, rule, self._now())
        self._policy.forget()

    def get_retention(self) -> dict[str, Any]:
        """The policy in effect for this session: ``source`` is "session", "default" or
        None; durations in seconds."""
        return describe(self._policies.effective(self.session_id), self.session_id)

    def clear_retention(self, *, entity_type: str | None = None) -> int:
        """Delete this session's own rules (or one entity type's); the default, if any,
        applies again. Returns how many rules were deleted."""
        scope_type = None if entity_type is None else checked_text(entity_type, "entity_type")
        deleted = self._policies.clear(self.session_id, scope_type)
        self._policy.forget()
        return deleted

    def prune(self, *, dry_run: bool = False) -> dict[str, int]:
        """Delete what this session's policy expired, in batches of at most 1,000 rows,
        each its own short transaction; ``dry_run`` only counts. Returns the counts of
        ``sessions``, ``turns``, ``snippets`` and ``entities`` deleted. Safe to run again
        after an interruption: it finishes the job."""
        return self._pruner().prune(self.session_id, dry_run=dry_run).as_dict()

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the database connections (of a store this memory opened). Data stays."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> ConversationEntityMemory:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- extraction -----------------------------------------------------------------------

    def _current_extractor(self) -> Extractor:
        if self._extractor is not None:
            return self._extractor
        if self.llm:
            return LLMExtractor(self.llm, self.entity_extraction_prompt)
        return StanzaExtractor.shared(self.lang)

    def _extract(self, text: str) -> ExtractionResult:
        return self._extraction.extract(text, self._current_extractor())

    def _extract_entities(self, text: str) -> list[str]:
        """Entity names in ``text``, as the original returned them; never raises."""
        return self._extract(text).names

    def _mentions(self, result: ExtractionResult) -> list[Mention]:
        """One mention per entity, in extraction order: the first form of the name, and
        the first type known for it."""
        mentions: dict[str, Mention] = {}
        for entity in result.entities:
            first = mentions.get(self.key_rules.key(entity.name))
            if first and first.entity_type != UNKNOWN_TYPE:
                continue
            mention = self._mention(first.name if first else entity.name, entity.entity_type)
            if mention.key:
                mentions[mention.key] = mention
        return list(mentions.values())

    def _mention(self, name: str, entity_type: str = UNKNOWN_TYPE) -> Mention:
        """``name`` as a mention: its key, core and markers under the memory's rules."""
        identity = identify(name, self.key_rules)
        return Mention(name, identity.key, entity_type, identity.core, identity.markers)

    # -- the original API ---------------------------------------------------------------

    def _texts(self, inputs: object, outputs: object) -> tuple[str, str]:
        return (
            mapping_text(inputs, self.input_key, "inputs"),
            mapping_text(outputs, self.output_key, "outputs"),
        )

    def _turn(self, inputs: object, outputs: object, idempotency_key: str | None) -> NewTurn:
        self.store.check_writable()  # before extraction: no model call for a refused write
        texts = self._texts(inputs, outputs)
        return self._new_turn(texts, self._extract(turn_text(*texts)), idempotency_key)

    def _new_turn(
        self, texts: tuple[str, str], result: ExtractionResult, idempotency_key: str | None
    ) -> NewTurn:
        input_text, output_text = texts
        return NewTurn(
            input_text,
            output_text,
            self._mentions(result),
            self._now(),
            idempotency_key,
            outcome(result),
        )

    def save_context(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
    ) -> None:
        """Extract the turn's entities and store the turn with one snippet per entity.

        With ``idempotency_key``, a second call with the same key in this session does nothing.
        """
        key = checked_key(idempotency_key)
        if key is not None:
            self._texts(inputs, outputs)
            if self._repository.has_turn(self.session_id, key):
                return
        self._expire_if_idle()
        self._repository.save_turn(self.session_id, self._turn(inputs, outputs, key))

    def save_contexts(self, pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> int:
        """Store many turns in one transaction, as a ``save_context`` loop would; returns
        how many. Nothing is stored if any pair is refused."""
        new_turns = [self._turn(inputs, outputs, None) for inputs, outputs in pairs]
        if new_turns:
            self._expire_if_idle()
        return len(self._repository.save_turns(self.session_id, new_turns))

    def load_memory_variables(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The recent snippets of every known entity the input mentions, as one string."""
        input_text = mapping_text(inputs, self.input_key, "inputs")
        mentions = self._mentions(self._extract(input_text))
        recalled = self._repository.recall(self.session_id, mentions, RECALL_LIMIT, self._visible())
        return self._variables(recalled)

    def _variables(self, recalled: list[tuple[EntityRecord, list[str]]]) -> dict[str, Any]:
        blocks = [
            self.entity_info_template.format(name=entity.name) + "\n" + "\n".join(snippets)
            for entity, snippets in recalled
            if snippets
        ]
        return {self.memory_key: "\n\n".join(blocks)}

    def clear(self) -> None:
        """Delete this session's turns, entities and snippets (other sessions are untouched)."""
        self._erasure.clear(self.session_id)

    def get_memory_stats(self) -> dict[str, Any]:
        return self._stats(self._repository.stats(self.session_id, self._visible()))

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
        return self.key_rules.key(checked_text(name, "entity name"))

    def _named(self, name: str) -> Mention:
        return self._mention(checked_text(name, "entity name"))

    def _find(self, name: str) -> EntityRecord | None:
        return self._repository.find_entity(self.session_id, self._named(name), self._visible())

    def get_entity_info(self, entity_name: str) -> dict[str, Any] | None:
        """What is known about one entity (found by its name or an alias), or None if it is
        not tracked; ``aliases`` lists its other names."""
        mention = self._named(entity_name)
        return entity_info(
            self._repository.entity_details(self.session_id, mention, RECALL_LIMIT, self._visible())
        )

    def list_entities(self) -> list[str]:
        """Display names of the session's entities in first-seen order."""
        return list(self.entity_store)

    def forget_entity(self, name: str, *, with_turns: bool = False) -> dict[str, Any]:
        """Erase one entity and its snippets, and its name from the turns that mention it;
        ``with_turns=True`` deletes those turns (and all their snippets) instead.

        Returns the counts of what was deleted; ``entities`` is 0 if nothing matched.
        """
        receipt = self._erasure.forget_entity(
            self.session_id, self._key(name), with_turns=with_turns, normalize=self.normalize_names
        )
        return asdict(receipt or ForgetReceipt())

    def reextract(self) -> dict[str, int]:
        """Run extraction again for this session's turns whose extraction failed, and
        attach their snippets as if it had worked the first time. Running it twice adds
        nothing twice. Returns ``{"repaired": n, "failed": m}`` (m still failing)."""
        self.store.check_writable()
        counts = {"repaired": 0, "failed": 0}
        for turn in self._ledger.failed_turns(self.session_id):
            result = self._extract(turn.text)
            recorded = self._ledger.repair_turn(
                turn, self._mentions(result), outcome(result), self._now()
            )
            if recorded:
                counts["repaired" if result.status == "ok" else "failed"] += 1
        return counts
