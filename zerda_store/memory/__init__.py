"""The ConversationEntityMemory and its views."""

from __future__ import annotations

from .conversation import ConversationEntityMemory
from .views import Entity

__all__ = ["ConversationEntityMemory", "Entity"]
