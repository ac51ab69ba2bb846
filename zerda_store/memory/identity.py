"""The memory's identity API: aliases, merges and the duplicates a person may merge."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..errors import MergeError
from ..identity.similar import similar_pairs
from ..telemetry.operations import DELETE, UPDATE, counts, observed
from ..validation import MAX_COUNT, MAX_ID, checked_name, checked_whole_number
from .base import MemoryCore, given_name, store_core

# Who decided, when the caller does not say (the CLI passes the operating-system user).
DECIDED_BY = "api"
MAX_DECIDED_BY = 255


class IdentityMethods(MemoryCore):
    """The identity calls of :class:`conversation.ConversationEntityMemory`."""

    @observed(UPDATE, store=store_core)
    def add_alias(self, name: str, alias: str) -> bool:
        """Make ``alias`` another name of the entity ``name`` names: a mention of the alias
        then names that entity (recall, saves, ``get_entity_info``). False if it was one
        already; a ValueError if the alias is another entity's name or alias (merge the
        two instead)."""
        self._store.check_writable()
        self._check_key_rules()
        return self._identity.add_alias(
            self.session_id,
            given_name(name),
            checked_name(given_name(alias, "alias"), "alias"),
            self._now(),
        )

    @observed(DELETE, store=store_core)
    def remove_alias(self, alias: str) -> bool:
        """Stop ``alias`` naming its entity; False if no entity had it."""
        self._store.check_writable()
        self._check_key_rules()
        return self._identity.remove_alias(self.session_id, given_name(alias, "alias"))

    @observed(UPDATE, store=store_core, done=counts)
    def merge_entities(self, keep: str, other: str) -> dict[str, Any]:
        """Merge the entity ``other`` names into the one ``keep`` names: its snippets and
        aliases move, its name becomes an alias, and the merge log keeps what
        :meth:`unmerge` needs to undo it exactly. Returns the receipt (``merge_id``, ...)."""
        self._store.check_writable()
        self._check_key_rules()
        receipt = self._identity.merge(
            self.session_id,
            given_name(keep),
            given_name(other),
            self._now(),
        )
        return asdict(receipt)

    @observed(UPDATE, store=store_core, done=counts)
    def unmerge(self, merge_id: int) -> dict[str, Any]:
        """Undo merge ``merge_id`` (see :meth:`merges`): both entities as they were."""
        self._store.check_writable()
        if isinstance(merge_id, bool) or not isinstance(merge_id, int):
            raise TypeError("merge_id must be an int")
        checked_whole_number(merge_id, "merge_id", 1, MAX_ID, MergeError)
        return asdict(self._identity.unmerge(self.session_id, merge_id, self._now()))

    def merges(self) -> list[dict[str, Any]]:
        """The session's merge log, oldest first (undone merges too, with ``undone_at``)."""
        return [asdict(entry) for entry in self._identity.merges(self.session_id)]

    def aliases(self) -> list[dict[str, Any]]:
        """The session's aliases: ``entity``, ``alias`` and ``source`` ("manual", "merge",
        or "mention" for a titled form that joined its entity). Under a retention policy,
        only the aliases of entities the reads show (none in a session idle past its
        ``session_idle``)."""
        entries = self._identity.aliases(self.session_id)
        visible = self._visible()
        if visible is not None:
            shown = {e.name for e in self._repository.iter_entities(self.session_id, visible)}
            entries = [entry for entry in entries if entry.entity in shown]
        return [asdict(entry) for entry in entries]

    def similar_entities(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Pairs of the session's entities that may be one, for a person to confirm with
        :meth:`confirm_same` (or :meth:`merge_entities`) or reject with
        :meth:`reject_same`; never merged automatically. Each pair: ``a``, ``b``,
        ``reason`` (a title or legal suffix, a possessive, the Arabic article, spacing,
        spelling, first name, transliteration, nickname, acronym) and ``score`` (0-1,
        how likely one entity), the likeliest first; at most ``limit`` pairs (None:
        all). A pair rejected with :meth:`reject_same` is never listed again."""
        if limit is not None:
            checked_whole_number(limit, "limit (or None for all)", 1, MAX_COUNT)
        self._check_key_rules()
        entities = self._identity.names_and_cores(self.session_id)
        rejected = self._identity.rejected_pairs(self.session_id)
        pairs = similar_pairs(
            [name for name, _, _ in entities],
            self.key_rules,
            limit,
            cores=[core for _, core, _ in entities],
            rejected=rejected,
            keys=[key for _, _, key in entities],
        )
        return [asdict(pair) for pair in pairs]

    def confirm_same(self, a: str, b: str, *, by: str = DECIDED_BY) -> dict[str, Any]:
        """A person's judgement that ``a`` and ``b`` name one entity: ``b``'s entity is
        merged into ``a``'s through the merge log (undone exactly by
        :meth:`undo_judgement`), and the judgement kept with ``by`` (who decided) and
        when. Returns the judgement (``a``, ``b``, ``verdict`` "same", ``decided_by``,
        ``decided_at``, ``merge_id``)."""
        self._store.check_writable()
        self._check_key_rules()
        judgement = self._identity.confirm_same(
            self.session_id,
            given_name(a),
            given_name(b),
            checked_name(by, "by", MAX_DECIDED_BY),
            self._now(),
        )
        return asdict(judgement)

    def reject_same(self, a: str, b: str, *, by: str = DECIDED_BY) -> dict[str, Any]:
        """A person's judgement that ``a`` and ``b`` are two entities: the pair is never
        suggested again in this session (until :meth:`undo_judgement`). Kept with ``by``
        and when; returns the judgement (``verdict`` "different")."""
        self._store.check_writable()
        self._check_key_rules()
        judgement = self._identity.reject_same(
            self.session_id,
            given_name(a),
            given_name(b),
            checked_name(by, "by", MAX_DECIDED_BY),
            self._now(),
        )
        return asdict(judgement)

    def undo_judgement(self, a: str, b: str) -> dict[str, Any]:
        """Undo the judgement of ``a`` and ``b`` (the names as judged): a confirmation's
        merge is undone (both entities as they were), a rejection removed (the pair may
        be suggested again). Returns the judgement undone; a ValueError if there is none."""
        self._store.check_writable()
        self._check_key_rules()
        judgement = self._identity.undo_judgement(
            self.session_id,
            given_name(a),
            given_name(b),
            self._now(),
        )
        return asdict(judgement)

    def judgements(self) -> list[dict[str, Any]]:
        """The session's judgements, oldest first: ``a``, ``b``, ``verdict`` ("same" or
        "different"), ``decided_by``, ``decided_at``, ``merge_id``."""
        return [asdict(judgement) for judgement in self._identity.judgements(self.session_id)]
