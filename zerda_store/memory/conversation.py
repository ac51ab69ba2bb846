"""The persistent ConversationEntityMemory: the original class API over SQL tables.

Each call validates its input, runs extraction outside any transaction, then makes one
repository call. No SQL lives here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from ..db.store import Store, core_of
from ..errors import KeyRulesMismatchError
from ..model.names import EXACT, FOLD_V2, FOLD_V2_CASELESS
from ..model.records import ForgetReceipt, turn_text
from ..retention.policy import describe, make_rule, type_scope
from ..telemetry.operations import DELETE, SEARCH, UPDATE, counts, note_recall, observed
from ..telemetry.operations import current as observed_operation
from ..turns.repository import Repository
from ..validation import (
    checked_session_id,
    mapping_text,
)
from .aio.conversation import AsyncMethods
from .base import RECALL_LIMIT, checked_key, entity_info, outcome, store_core
from .identity import IdentityMethods


class ConversationEntityMemory(IdentityMethods, AsyncMethods):
    """Entity memory for a chat assistant, kept in SQLite or Postgres.

    The original's constructor arguments come first, in the same order; the keyword-only
    ones choose the database (``database_url`` or a shared ``store``), the conversation
    (``session_id``) and the deliberate differences from the original. Every call has an
    awaitable twin (``asave_context``, ``aload_memory_variables``, ...: :class:`AsyncMethods`).
    ``clock`` (seconds since the epoch; ``time.time`` by default) dates what is saved and
    decides what a retention policy has expired; ``parts`` (:class:`MemoryParts`) are the
    store and repositories to run on instead of those built from the store, as a unit test
    passes fakes. The constructor is :class:`MemoryCore`'s.
    """

    @classmethod
    def for_session(cls, store: Store, session_id: str, **options: Any) -> ConversationEntityMemory:
        """A memory on an existing session with the session's own key mode: a session
        written with ``normalize_names=False`` has keys that are not normalized (it may hold
        both "Sarah" and "sarah"), and its names then match exactly."""
        recorded = Repository(core_of(store)).key_rules(checked_session_id(session_id))
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
        scope_type = type_scope(entity_type)
        self._policies.set(self.session_id, scope_type, rule, self._now())
        self._policy.forget()

    def get_retention(self) -> dict[str, Any]:
        """The policy in effect for this session: ``source`` is "session", "default" or
        None; durations in seconds."""
        return describe(self._policies.effective(self.session_id), self.session_id)

    def clear_retention(self, *, entity_type: str | None = None) -> int:
        """Delete this session's own rules (or one entity type's); the default, if any,
        applies again. Returns how many rules were deleted."""
        scope_type = None if entity_type is None else type_scope(entity_type)
        deleted = self._policies.clear(self.session_id, scope_type)
        self._policy.forget()
        return deleted

    @observed(DELETE, store=store_core, done=counts)
    def prune(self, *, dry_run: bool = False) -> dict[str, int]:
        """Delete what this session's policy expired, in batches of at most 1,000 rows,
        each its own short transaction; ``dry_run`` only counts. Returns the counts of
        ``sessions``, ``turns``, ``snippets`` and ``entities`` deleted. Safe to run again
        after an interruption: it finishes the job."""
        return self._pruner().prune(self.session_id, dry_run=dry_run).as_dict()

    # -- the original API ---------------------------------------------------------------

    @observed(UPDATE, store=store_core)
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
        texts = self._texts(inputs, outputs)
        if key is not None and self._repository.has_turn(self.session_id, key):
            return
        self._store.check_writable()  # before extraction: no model call for a refused write
        self._expire_if_idle()
        turn = self._new_turn(texts, self._extract(turn_text(*texts)), key)
        self._repository.save_turn(self.session_id, turn)

    @observed(UPDATE, store=store_core)
    def save_contexts(self, pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> int:
        """Store many turns in one transaction, as a ``save_context`` loop would; returns
        how many. Nothing is stored if any pair is refused."""
        new_turns = [self._turn(inputs, outputs, None) for inputs, outputs in pairs]
        if new_turns:
            self._expire_if_idle()
        return len(self._repository.save_turns(self.session_id, new_turns))

    @observed(SEARCH, store=store_core)
    def load_memory_variables(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The recent snippets of every known entity the input mentions, as one string."""
        input_text = mapping_text(inputs, self.input_key, "inputs")
        self._check_key_rules()
        mentions = self._mentions(self._extract(input_text))
        recalled = self._repository.recall(self.session_id, mentions, RECALL_LIMIT, self._visible())
        if observed_operation.get() is not None:
            note_recall(recalled, input_text)
        return self._variables(recalled)

    @observed(DELETE, store=store_core)
    def clear(self) -> None:
        """Delete this session's turns, entities and snippets (other sessions are untouched)."""
        self._erasure.clear(self.session_id)

    def get_memory_stats(self) -> dict[str, Any]:
        return self._stats(self._repository.stats(self.session_id, self._visible()))

    @observed(SEARCH, store=store_core)
    def get_entity_info(self, entity_name: str) -> dict[str, Any] | None:
        """What is known about one entity (found by its name or an alias), or None if it is
        not tracked; ``aliases`` lists its other names."""
        mention = self._named(entity_name)
        self._check_key_rules()
        return entity_info(
            self._repository.entity_details(self.session_id, mention, RECALL_LIMIT, self._visible())
        )

    def list_entities(self) -> list[str]:
        """Display names of the session's entities in first-seen order."""
        return list(self.entity_store)

    @observed(DELETE, store=store_core, done=counts)
    def forget_entity(
        self, name: str, *, with_turns: bool = False, dry_run: bool = False
    ) -> dict[str, Any]:
        """Erase one entity and its snippets, and its name from the turns that mention it;
        ``with_turns=True`` deletes those turns (and all their snippets) instead.

        Returns the counts of what was deleted; ``entities`` is 0 if nothing matched.
        ``dry_run=True`` deletes nothing and returns what would be deleted.
        """
        key = self._key(name)
        self._check_key_rules()
        receipt = self._erasure.forget_entity(
            self.session_id,
            key,
            with_turns=with_turns,
            normalize=self.normalize_names,
            dry_run=dry_run,
        )
        return asdict(receipt or ForgetReceipt())

    @observed(UPDATE, store=store_core, done=counts)
    def reextract(self) -> dict[str, int]:
        """Run extraction again for this session's turns whose extraction failed, and
        attach their snippets as if it had worked the first time. Running it twice adds
        nothing twice. Returns ``{"repaired": n, "failed": m}`` (m still failing)."""
        self._store.check_writable()
        counts = {"repaired": 0, "failed": 0}
        for turn in self._ledger.failed_turns(self.session_id):
            result = self._extract(turn.text)
            recorded = self._ledger.repair_turn(
                turn, self._mentions(result), outcome(result), self._now()
            )
            if recorded:
                counts["repaired" if result.status == "ok" else "failed"] += 1
        return counts
