"""A session's turns read back: counts, pages and slices, under a retention policy or
not (:class:`TurnHistory`, the base of :class:`repository.Repository`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from ..db.execution.unit_of_work import Transaction
from ..db.store import StoreCore
from ..model.records import TurnRecord
from ..retention.policy import Visibility
from .queries import Queries, TurnReads
from .rows import turn_record
from .visible import VisibleQueries

PAGE_SIZE = 500


class TurnHistory:
    """The turn reads of one store's memories."""

    def __init__(self, store: StoreCore) -> None:
        self.store = store
        self._queries = store.statements(Queries)
        self._visible = store.statements(VisibleQueries)

    def _one(self, statement: Any, values: dict[str, Any]) -> list[Any]:
        return self.store.read(lambda transaction: transaction.run(statement, values))

    def _turn_reads(
        self, session_id: str, visible: Visibility | None
    ) -> tuple[TurnReads, dict[str, Any]]:
        """The turn reads to use, and the values every one of them takes."""
        if visible is None:
            return self._queries.turn_reads, {"session_id": session_id}
        return self._visible.turn_reads, {
            "session_id": session_id,
            "turn_cutoff": visible.turn_cutoff,
        }

    def count_turns(self, session_id: str, visible: Visibility | None = None) -> int:
        reads, values = self._turn_reads(session_id, visible)
        return int(self._one(reads.count, values)[0].count)

    def turns_page(
        self,
        session_id: str,
        offset: int,
        limit: int,
        *,
        newest_first: bool = False,
        visible: Visibility | None = None,
    ) -> list[TurnRecord]:
        """``limit`` turns from position ``offset``, in saved order (or counting from the
        newest turn, for negative indexes)."""
        reads, values = self._turn_reads(session_id, visible)
        statement = reads.newest_first if newest_first else reads.page
        values.update(offset=offset, limit=limit)
        return [turn_record(row) for row in self._one(statement, values)]

    def iter_turns(
        self,
        session_id: str,
        *,
        offset: int = 0,
        count: int | None = None,
        newest_first: bool = False,
        visible: Visibility | None = None,
    ) -> Iterator[TurnRecord]:
        """``count`` turns (None: all the rest) from position ``offset`` in saved order, or
        counting from the newest turn back, fetched a page at a time."""
        pages = self._turn_pages(
            self._one, session_id, offset, count, PAGE_SIZE, newest_first, visible
        )
        return itertools.chain.from_iterable(pages)

    def turns_slice(
        self, session_id: str, index: slice, visible: Visibility | None = None
    ) -> list[TurnRecord]:
        """The turns ``index`` picks, as the same slice of a list of the session's turns
        would (any step; bounds negative or out of range), seen in one snapshot. The turns
        from the first to the last one picked are read a page at a time."""
        return self.store.read(
            lambda transaction: self._slice(transaction, session_id, index, visible),
            snapshot=True,
        )

    def _slice(
        self,
        transaction: Transaction,
        session_id: str,
        index: slice,
        visible: Visibility | None,
    ) -> list[TurnRecord]:
        reads, values = self._turn_reads(session_id, visible)
        count = transaction.run(reads.count, values)[0].count
        positions = range(*index.indices(int(count)))
        if not positions:
            return []
        stride = abs(positions.step)
        span = (len(positions) - 1) * stride + 1
        page_size = span if stride == 1 else PAGE_SIZE  # a step of 1 keeps all it reads
        pages = self._turn_pages(
            transaction.run, session_id, min(positions), span, page_size, False, visible
        )
        picked = list(itertools.islice(itertools.chain.from_iterable(pages), 0, None, stride))
        return picked if positions.step > 0 else picked[::-1]

    def _turn_pages(
        self,
        run: Callable[[Any, dict[str, Any]], list[Any]],
        session_id: str,
        offset: int,
        count: int | None,
        page_size: int,
        newest_first: bool,
        visible: Visibility | None = None,
    ) -> Iterator[list[TurnRecord]]:
        """Pages of ``count`` turns (None: to the end) from position ``offset``. Only the
        first page is found by its offset; each next one by the id of the last turn seen,
        so that the database never skips the turns before it again."""
        reads, shared = self._turn_reads(session_id, visible)
        if newest_first:
            statement, following, key = reads.newest_first, reads.before, "before"
        else:
            statement, following, key = reads.page, reads.after, "after"
        values: dict[str, Any] = {**shared, "offset": offset}
        remaining = count
        while remaining is None or remaining > 0:
            limit = page_size if remaining is None else min(page_size, remaining)
            rows = run(statement, {**values, "limit": limit})
            yield [turn_record(row) for row in rows]
            if len(rows) < limit:
                return
            if remaining is not None:
                remaining -= limit
            statement, values = following, {**shared, key: rows[-1].id}
