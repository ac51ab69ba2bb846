"""The memory's identity API: aliases, merges and the duplicates a person may merge."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..db.validation import checked_text
from ..identity.similar import similar_pairs

if TYPE_CHECKING:
    from .conversation import ConversationEntityMemory


class IdentityMethods:
    """Mixed into :class:`ConversationEntityMemory`."""

    def add_alias(self, name: str, alias: str) -> bool:
        """Make ``alias`` another name of the entity ``name`` names: a mention of the alias
        then names that entity (recall, saves, ``get_entity_info``). False if it was one
        already; a ValueError if the alias is another entity's name or alias (merge the
        two instead)."""
        memory = _memory(self)
        memory.store.check_writable()
        return memory._identity.add_alias(
            memory.session_id,
            checked_text(name, "entity name"),
            checked_text(alias, "alias"),
            memory._now(),
        )

    def remove_alias(self, alias: str) -> bool:
        """Stop ``alias`` naming its entity; False if no entity had it."""
        memory = _memory(self)
        memory.store.check_writable()
        return memory._identity.remove_alias(memory.session_id, checked_text(alias, "alias"))

    def merge_entities(self, keep: str, other: str) -> dict[str, Any]:
        """Merge the entity ``other`` names into the one ``keep`` names: its snippets and
        aliases move, its name becomes an alias, and the merge log keeps what
        :meth:`unmerge` needs to undo it exactly. Returns the receipt (``merge_id``, ...)."""
        memory = _memory(self)
        memory.store.check_writable()
        receipt = memory._identity.merge(
            memory.session_id,
            checked_text(keep, "entity name"),
            checked_text(other, "entity name"),
            memory._now(),
        )
        return asdict(receipt)

    def unmerge(self, merge_id: int) -> dict[str, Any]:
        """Undo merge ``merge_id`` (see :meth:`merges`): both entities as they were."""
        memory = _memory(self)
        memory.store.check_writable()
        if isinstance(merge_id, bool) or not isinstance(merge_id, int):
            raise TypeError("merge_id must be an int")
        return asdict(memory._identity.unmerge(memory.session_id, merge_id, memory._now()))

    def merges(self) -> list[dict[str, Any]]:
        """The session's merge log, oldest first (undone merges too, with ``undone_at``)."""
        memory = _memory(self)
        return [asdict(entry) for entry in memory._identity.merges(memory.session_id)]

    def aliases(self) -> list[dict[str, Any]]:
        """The session's aliases: ``entity``, ``alias`` and ``source`` ("manual", "merge",
        or "mention" for a titled form that joined its entity)."""
        memory = _memory(self)
        return [asdict(entry) for entry in memory._identity.aliases(memory.session_id)]

    def similar_entities(self) -> list[dict[str, str]]:
        """Pairs of the session's entities that may be one, for a person to confirm with
        :meth:`merge_entities` (never merged automatically): ``a``, ``b`` and ``reason``."""
        memory = _memory(self)
        names = [entity.name for entity in memory._repository.iter_entities(memory.session_id)]
        return [asdict(pair) for pair in similar_pairs(names, memory.key_rules)]


def _memory(mixin: IdentityMethods) -> ConversationEntityMemory:
    return mixin  # type: ignore[return-value]
