"""zerda_store: a persistent, SQL-backed ConversationEntityMemory (SQLite or Postgres)."""

from __future__ import annotations

from .admin import AdminRepository
from .db import migrate
from .db.engine import Store
from .errors import (
    CancelledAfterCommitError,
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
from .identity.merging import MergeError
from .identity.resolution import KeyRulesMismatchError
from .memory.conversation import ConversationEntityMemory
from .memory.views import Entity

__all__ = [
    "AdminRepository",
    "CancelledAfterCommitError",
    "CommitOutcomeUnknownError",
    "ConversationEntityMemory",
    "DatabaseError",
    "DatabaseUnavailableError",
    "Entity",
    "ExtractedEntity",
    "ExtractionResult",
    "ExtractionService",
    "Extractor",
    "KeyRulesMismatchError",
    "LLMExtractor",
    "LockTimeoutError",
    "MergeError",
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
    "migrate",
]
