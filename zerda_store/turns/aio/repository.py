"""The repository's saves and reads, awaited: the same units of work as
:class:`repository.Repository` builds for its sync methods (``..._work``, and the save
:meth:`Repository.turn_save` describes), run on the store's database threads
(:meth:`Store.awrite`, :meth:`Store.aread`), except where the store's routes send them
from the event loop (:mod:`db.routes`: a turn's two short reads, and a save that fits one
round trip).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...model.records import EntityRecord, Mention, NewTurn, SessionStats
from ...retention.policy import Visibility
from ..reads import recalled
from ..repository import Repository

T = TypeVar("T")


class AsyncRepository:
    """The async twin of one memory's :class:`Repository`."""

    __slots__ = ("_repository", "store")

    def __init__(self, repository: Repository) -> None:
        self._repository = repository
        self.store = repository.store

    async def save_turn(self, session_id: str, turn: NewTurn) -> int | None:
        """:meth:`Repository.save_turn`, awaited: the same save, by the same routes
        (:meth:`db.routes.Routes.asave`)."""
        repository = self._repository
        return await repository.routes.asave(repository.turn_save(session_id, turn))

    async def has_turn(self, session_id: str, idempotency_key: str) -> bool:
        """:meth:`Repository.has_turn`, awaited."""
        work = self._repository.has_turn_work(session_id, idempotency_key)
        return bool(await self._short_read(work))

    async def recall(
        self, session_id: str, mentions: Sequence[Mention], limit: int, visible: Visibility | None
    ) -> list[tuple[str, list[str]]]:
        """:meth:`Repository.recall`, awaited."""
        work = self._repository.recall_work(session_id, mentions, limit, visible)
        rows, unique = await self._short_read(work)
        return recalled(rows, unique, visible)

    async def _short_read(self, work: Callable[[Any], T]) -> T:
        """A read of a statement or two, where it costs least (:meth:`db.routes.Routes.aread`)."""
        return await self._repository.routes.aread(work)

    async def entity_details(
        self, session_id: str, mention: Mention, limit: int, visible: Visibility | None
    ) -> tuple[EntityRecord, int, list[str], list[str]] | None:
        """:meth:`Repository.entity_details`, awaited."""
        work = self._repository.details_work(session_id, mention, limit, visible)
        return await self.store.aread(work, snapshot=True)

    async def list_entities(
        self, session_id: str, visible: Visibility | None
    ) -> list[EntityRecord]:
        """:meth:`Repository.iter_entities`, awaited: every page read on one connection."""
        return await self.store.aread(self._repository.entities_work(session_id, visible))

    async def stats(self, session_id: str, visible: Visibility | None) -> SessionStats:
        """:meth:`Repository.stats`, awaited."""
        work = self._repository.stats_work(session_id, visible)
        return await self.store.aread(work, snapshot=visible is not None)
