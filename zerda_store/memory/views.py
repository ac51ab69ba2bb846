"""The read-only views a memory offers: its entities as a mapping, its turns as a
sequence, and one entity. Each reads the database when asked, never all of it at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from ..errors import StoreError
from ..model.records import EntityRecord, Mention, TurnRecord
from ..retention.policy import Visibility
from ..turns.repository import Repository
from ..validation import MAX_COUNT, MAX_ID, checked_text, checked_whole_number


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
        if limit is not None:
            checked_whole_number(limit, "limit (or None for all)", 1, MAX_COUNT)
        return self._repository.recent_contexts(
            self._session_id, self._id, limit, self._visible(), self.entity_type
        )


class EntityStoreView(Mapping[str, Entity]):
    """A read-only mapping of the session's entities, read from the database on demand.

    It is given the parts it reads with: the repository, the session, the clock, what the
    retention policy lets reads show now, how a name becomes a mention, and the check of
    the session's key rules a lookup by name runs first."""

    def __init__(
        self,
        repository: Repository,
        session_id: str,
        now: Callable[[], float],
        visible: Callable[[], Visibility | None],
        mention: Callable[[str], Mention],
        check_key_rules: Callable[[], None],
    ) -> None:
        self._repository = repository
        self._session_id = session_id
        self._now = now
        self._visible = visible
        self._mention = mention
        self._check_key_rules = check_key_rules

    def __getitem__(self, name: str) -> Entity:
        try:
            mention = self._mention(name)
            self._check_key_rules()
            record = self._repository.find_entity(self._session_id, mention, self._visible())
        except StoreError:  # a database's refusal (other key rules) is not a missing key
            raise
        except (TypeError, ValueError):  # not a name that could have been stored
            record = None
        if record is None:
            raise KeyError(name)
        return Entity(self._repository, self._session_id, record, self._now, self._visible)

    def __iter__(self) -> Iterator[str]:
        records = self._repository.iter_entities(self._session_id, self._visible())
        return (record.name for record in records)

    def __len__(self) -> int:
        return self._repository.count_entities(self._session_id, self._visible())


def _turn_dict(turn: TurnRecord) -> dict[str, Any]:
    return {"input": turn.input_text, "output": turn.output_text, "entities": turn.entity_names}


class ChatMemoryView(Sequence[dict[str, Any]]):
    """A read-only sequence of the session's turns as ``{"input", "output", "entities"}``.
    Slices (any step), ``reversed`` and ``index`` read the turns a page at a time."""

    def __init__(
        self,
        repository: Repository,
        session_id: str,
        visible: Callable[[], Visibility | None],
    ) -> None:
        self._repository = repository
        self._session_id = session_id
        self._visible = visible

    def __len__(self) -> int:
        return self._repository.count_turns(self._session_id, self._visible())

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        repository, session_id = self._repository, self._session_id
        visible = self._visible()
        if isinstance(index, slice):
            return [_turn_dict(t) for t in repository.turns_slice(session_id, index, visible)]
        if not -MAX_ID <= index < MAX_ID:  # beyond any offset a database takes
            raise IndexError("chat_memory index out of range")
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
        turns = self._repository.iter_turns(self._session_id, visible=self._visible())
        return (_turn_dict(t) for t in turns)

    def __reversed__(self) -> Iterator[dict[str, Any]]:
        """The turns from the newest back, a page at a time (not a query per turn)."""
        turns = self._repository.iter_turns(
            self._session_id, newest_first=True, visible=self._visible()
        )
        return (_turn_dict(t) for t in turns)

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """The position of the first turn equal to ``value`` from ``start`` to ``stop``, as
        ``list.index`` finds it; the turns are read a page at a time."""
        first, last, _ = slice(start, stop).indices(len(self))
        turns = self._repository.iter_turns(
            self._session_id,
            offset=first,
            count=max(0, last - first),
            visible=self._visible(),
        )
        for position, turn in enumerate(turns, first):
            if _turn_dict(turn) == value:
                return position
        raise ValueError(f"{value!r} is not in chat_memory")
