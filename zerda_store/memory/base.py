"""Small pieces the sync calls of :mod:`memory` and their async twins
(:mod:`async_memory`) share."""

from __future__ import annotations

from typing import Any

from ..db.validation import MAX_IDEMPOTENCY_KEY_LENGTH, checked_identifier
from ..extraction import ExtractionResult
from ..model.records import EntityRecord, Outcome

# Snippets recalled per entity.
RECALL_LIMIT = 3


def outcome(result: ExtractionResult) -> Outcome:
    """An extraction's outcome as the ledger records it."""
    return Outcome(result.extractor, result.status, result.error, result.latency)


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
