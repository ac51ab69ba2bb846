"""zerda_store: a persistent, SQL-backed ConversationEntityMemory (SQLite or Postgres)."""

from __future__ import annotations

from .engine import Store
from .errors import (
    CommitOutcomeUnknownError,
    DatabaseError,
    DatabaseUnavailableError,
    LockTimeoutError,
    NotAStoreDatabaseError,
    PermissionDeniedError,
    PoolExhaustedError,
    ReadOnlyStoreError,
    SchemaNotCurrentError,
    SessionNotEmptyError,
    StatementTimeoutError,
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
    "DatabaseError",
    "DatabaseUnavailableError",
    "Entity",
    "ExtractedEntity",
    "ExtractionResult",
    "ExtractionService",
    "Extractor",
    "LLMExtractor",
    "LockTimeoutError",
    "NotAStoreDatabaseError",
    "PermissionDeniedError",
    "PoolExhaustedError",
    "ReadOnlyStoreError",
    "SchemaNotCurrentError",
    "SessionNotEmptyError",
    "StanzaExtractor",
    "StatementTimeoutError",
    "Store",
    "StoreError",
]
