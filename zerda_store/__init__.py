"""zerda_store: a persistent, SQL-backed ConversationEntityMemory (SQLite or Postgres).

The names below are loaded on first use (``from zerda_store import Store`` loads the store
and SQLAlchemy's core), so that importing the package, or starting the command line for
its help, loads none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import migrate
    from .admin import AdminRepository
    from .db.store import Store
    from .errors import (
        CancelledAfterCommitError,
        CommitOutcomeUnknownError,
        DatabaseError,
        DatabaseUnavailableError,
        KeyRulesMismatchError,
        LockTimeoutError,
        MergeError,
        NotAStoreDatabaseError,
        PermissionDeniedError,
        PoolerModeError,
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
    from .memory.conversation import ConversationEntityMemory
    from .memory.views import Entity
    from .telemetry import Telemetry

# Where each public name lives (``migrate`` is a module).
_HOMES = {
    "AdminRepository": "admin",
    "CancelledAfterCommitError": "errors",
    "CommitOutcomeUnknownError": "errors",
    "ConversationEntityMemory": "memory.conversation",
    "DatabaseError": "errors",
    "DatabaseUnavailableError": "errors",
    "Entity": "memory.views",
    "ExtractedEntity": "extraction",
    "ExtractionResult": "extraction",
    "ExtractionService": "extraction",
    "Extractor": "extraction",
    "KeyRulesMismatchError": "errors",
    "LLMExtractor": "extraction",
    "LockTimeoutError": "errors",
    "MergeError": "errors",
    "NotAStoreDatabaseError": "errors",
    "PermissionDeniedError": "errors",
    "PoolerModeError": "errors",
    "PoolExhaustedError": "errors",
    "ReadOnlyStoreError": "errors",
    "SchemaNotCurrentError": "errors",
    "SessionNotEmptyError": "errors",
    "StanzaExtractor": "extraction",
    "StatementTimeoutError": "errors",
    "Store": "db.store",
    "StoreError": "errors",
    "Telemetry": "telemetry",
    "migrate": "migrate",
}

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
    "PoolerModeError",
    "ReadOnlyStoreError",
    "SchemaNotCurrentError",
    "SessionNotEmptyError",
    "StanzaExtractor",
    "StatementTimeoutError",
    "Store",
    "StoreError",
    "Telemetry",
    "migrate",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{home}", __name__)
    value = module if name == "migrate" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
