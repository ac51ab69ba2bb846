"""zerda_store: a persistent, SQL-backed ConversationEntityMemory (SQLite or Postgres)."""

from __future__ import annotations

from .engine import Store
from .errors import (
    CommitOutcomeUnknownError,
    DatabaseUnavailableError,
    LockTimeoutError,
    NotAStoreDatabaseError,
    ReadOnlyStoreError,
    SchemaNotCurrentError,
    SessionNotEmptyError,
    StoreError,
)
from .extraction import (
    ExtractedEntity,
    ExtractionResult,
    ExtractionService,
    Extractor,
    LLMExtractor,
    StanzaExtractor,
)
from .memory import ConversationEntityMemory
from .views import Entity

__all__ = [
    "CommitOutcomeUnknownError",
    "ConversationEntityMemory",
    "DatabaseUnavailableError",
    "Entity",
    "ExtractedEntity",
    "ExtractionResult",
    "ExtractionService",
    "Extractor",
    "LLMExtractor",
    "LockTimeoutError",
    "NotAStoreDatabaseError",
    "ReadOnlyStoreError",
    "SchemaNotCurrentError",
    "SessionNotEmptyError",
    "StanzaExtractor",
    "Store",
    "StoreError",
]
