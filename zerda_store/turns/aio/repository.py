"""The repository's saves and reads, awaited: the same units of work as
:class:`repository.Repository` builds for its sync methods (``..._work``), run on the
store's database threads (:meth:`Store.awrite`, :meth:`Store.aread`).

On SQLite the two reads of a turn (the recall and the idempotency key's check) run on the
event loop itself: each is one or two indexed statements on a local file, tens of
microseconds of CPU, less than the hand-off to a thread and back costs (two thread
wake-ups). On Postgres they are one statement each, sent from the event loop on an idle
connection, the loop serving other requests while the server answers
(:mod:`db.loop_reads`), and so is a save that fits one round trip (:mod:`db.loop_writes`).
Every other read and write goes to a database thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...db.aio import loop_reads, loop_writes
from ...db.execution.unit_of_work import OneStatement
from ...model.records import EntityRecord, Mention, NewTurn, SessionStats
from ...retention.policy import Visibility
from ..repository import Repository, one_trip_outcome
from ..rows import recalled

T = TypeVar("T")


class AsyncRepository:
    """The async twin of one memory's :class:`Repository`."""

    __slots__ = ("_repository", "store")

    def __init__(self, repository: Repository) -> None:
        self._repository = repository
        self.store = repository.store

    async def save_turn(self, session_id: str, turn: NewTurn) -> int | None:
        """:meth:`Repository.save_turn`, awaited: on Postgres a turn that fits is saved in
        one round trip, as there: from the event loop when an idle connection is at hand
        and nothing needs reading first, else on a database thread."""
        repository = self._repository
        if self.store.dialect != "postgresql":
            return await self.store.awrite(*repository.save_turn_work(session_id, turn))
        steps = repository.one_trip_steps(session_id, turn)
        if steps is not None:
            self.store.check_writable()
            rows = await loop_writes.write(self.store, steps, _stored)
            if not isinstance(rows, loop_writes.NotSent):
                done, turn_id = one_trip_outcome(rows)
                if done:
                    return turn_id
                return await self.store.awrite(*repository.save_turn_work(session_id, turn))

        def first(before_send: Callable[[], None]) -> tuple[bool, int | None]:
            # On the thread: deciding whether one trip fits may read (once a store).
            one_trip = repository.one_trip_save(session_id, turn)
            if one_trip is None:
                return False, None
            before_send()  # a cancellation until here stops the save
            return one_trip()

        return await self.store.awrite_in_one_trip(
            first, lambda: repository.save_turn_work(session_id, turn)
        )

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
        """A read of a statement or two: on SQLite run here, on the event loop (see the
        module); on Postgres one statement is sent from the event loop (:mod:`aio.loop_reads`),
        anything else goes to a database thread."""
        if self.store.dialect == "sqlite":
            return self.store.read(work)
        if isinstance(work, OneStatement):
            return await loop_reads.read(self.store, work)
        return await self.store.aread(work)

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


def _stored(rows: list[Any]) -> bool:
    """Whether a one-trip save's turn is stored (by it, or for an idempotency key used
    before, by an earlier call); not when its names need resolution."""
    return one_trip_outcome(rows)[0]
