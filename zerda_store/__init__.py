"""zerda_store: a persistent, SQL-backed ConversationEntityMemory (SQLite or Postgres).

The names below are loaded on first use (``from zerda_store import Store`` loads the store
and SQLAlchemy's core), so that importing the package, or starting the command line for
its help, loads none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "CommitOutcomeUnknownError": "errors",
    "ConversationEntityMemory": "memory",
    "DatabaseUnavailableError": "errors",
    "Entity": "views",
    "ExtractedEntity": "extraction",
    "ExtractionResult": "extraction",
    "ExtractionService": "extraction",
    "Extractor": "extraction",
    "LLMExtractor": "extraction",
    "LockTimeoutError": "errors",
    "NotAStoreDatabaseError": "errors",
    "ReadOnlyStoreError": "errors",
    "SchemaNotCurrentError": "errors",
    "SessionNotEmptyError": "errors",
    "StanzaExtractor": "extraction",
    "Store": "engine",
    "StoreError": "errors",
}

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
