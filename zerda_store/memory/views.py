"""The read-only views a memory offers: its entities as a mapping, its turns as a
sequence, and one entity. Each reads the database when asked, never all of it at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from ..db.validation import checked_text
from ..model.records import EntityRecord, TurnRecord
from ..retention.policies import Visibility
from ..turns.repository import Repository

if TYPE_CHECKING:
    from .conversation import ConversationEntityMemory


class Entity:
    """A tracked entity. Its fields are a snapshot; ``contexts`` is read when asked for."""

    def __init__(
        self,
        repository: Repository,
        session_id: str,
        record: EntityRecord,
        now: Callable[[], float],
        visible: Callable[[], Visibility | None] = lambda: None,
    ) -> None:
        self._repository = repository
        self._session_id = session_id
        self._now = now
        self._visible = visible
        self._id = record.id
        self.name = record.name
        self.entity_type = record.entity_type
        self.first_seen = record.first_seen
        self.last_seen = record.last_seen

    def __repr__(self) -> str:
        return f"Entity(name={self.name!r}, entity_type={self.entity_type!r})"

    @property
    def contexts(self) -> list[str]:
        """Every snippet of the entity, oldest first."""
        return self._repository.recent_contexts(
            self._session_id, self._id, None, self._visible(), self.entity_type
        )

    def add_context(self, context: str) -> None:
        """Store a snippet for this entity; it counts as the most recent one."""
        text = checked_text(context, "context")
        self.last_seen = self._repository.add_context(self._session_id, self._id, text, self._now())

    def get_recent_contexts(self, limit: int | None = 3) -> list[str]:
        """The last ``limit`` snippets, oldest first; ``None`` gives all of them."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 (or None for all), got {limit}")
        return self._repository.recent_contexts(
            self._session_id, self._id, limit, self._visible(), self.entity_type
        )


class EntityStoreView(Mapping[str, Entity]):
    """A read-only mapping of the session's entities, read from the database on demand."""

    def __init__(self, memory: ConversationEntityMemory) -> None:
        self._memory = memory

    def __getitem__(self, name: str) -> Entity:
        try:
            record = self._memory._find(name)
        except (TypeError, ValueError):  # not a name that could have been stored
            record = None
        if record is None:
            raise KeyError(name)
        memory = self._memory
        return Entity(memory._repository, memory.session_id, record, memory._now, memory._visible)

    def __iter__(self) -> Iterator[str]:
        memory = self._memory
        records = memory._repository.iter_entities(memory.session_id, memory._visible())
        return (record.name for record in records)

    def __len__(self) -> int:
        memory = self._memory
        return memory._repository.count_entities(memory.session_id, memory._visible())


def _turn_dict(turn: TurnRecord) -> dict[str, Any]:
    return {"input": turn.input_text, "output": turn.output_text, "entities": turn.entity_names}


class ChatMemoryView(Sequence[dict[str, Any]]):
    """A read-only sequence of the session's turns as ``{"input", "output", "entities"}``.
    Slices (any step), ``reversed`` and ``index`` read the turns a page at a time."""

    def __init__(self, memory: ConversationEntityMemory) -> None:
        self._memory = memory

    def __len__(self) -> int:
        memory = self._memory
        return memory._repository.count_turns(memory.session_id, memory._visible())

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        repository, session_id = self._memory._repository, self._memory.session_id
        visible = self._memory._visible()
        if isinstance(index, slice):
            return [_turn_dict(t) for t in repository.turns_slice(session_id, index, visible)]
        if index < 0:  # counted from the newest turn: no need to count them all first
            page = repository.turns_page(
                session_id, -index - 1, 1, newest_first=True, visible=visible
            )
        else:
            page = repository.turns_page(session_id, index, 1, visible=visible)
        if not page:
            raise IndexError("chat_memory index out of range")
        return _turn_dict(page[0])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        memory = self._memory
        turns = memory._repository.iter_turns(memory.session_id, visible=memory._visible())
        return (_turn_dict(t) for t in turns)

    def __reversed__(self) -> Iterator[dict[str, Any]]:
        """The turns from the newest back, a page at a time (not a query per turn)."""
        memory = self._memory
        turns = memory._repository.iter_turns(
            memory.session_id, newest_first=True, visible=memory._visible()
        )
        return (_turn_dict(t) for t in turns)

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """The position of the first turn equal to ``value`` from ``start`` to ``stop``, as
        ``list.index`` finds it; the turns are read a page at a time."""
        first, last, _ = slice(start, stop).indices(len(self))
        memory = self._memory
        turns = memory._repository.iter_turns(
            memory.session_id,
            offset=first,
            count=max(0, last - first),
            visible=memory._visible(),
        )
        for position, turn in enumerate(turns, first):
            if _turn_dict(turn) == value:
                return position
        raise ValueError(f"{value!r} is not in chat_memory")
