"""Progress of the commands that move rows (``import``, ``export``, ``copy``): one bar that
counts records against their total, on standard error when it is a terminal, and nothing
at all otherwise (a script's output and logs stay clean)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class RowBar:
    """A bar of ``total`` rows; :meth:`counted` wraps the iterables whose items it counts."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def counted(self, items: Iterable[T]) -> Iterable[T]:
        """``items``, counted on the bar as they are read. Iterated again (a unit of work run
        again whole), it counts from where it first started, not twice."""
        return _Counted(items, self._bar)


class _Counted(Iterable[T]):
    def __init__(self, items: Iterable[T], bar: Any) -> None:
        self._items = items
        self._bar = bar
        self._start: int | None = None

    def __iter__(self) -> Iterator[T]:
        if self._start is None:
            self._start = self._bar.n
        elif self._bar.n != self._start:
            self._bar.n = self._start
            self._bar.refresh()
        for item in self._items:
            yield item
            self._bar.update(1)


@contextmanager
def row_bar(description: str, total: int) -> Iterator[RowBar]:
    """A bar of ``total`` rows while the block runs, shown only on a terminal."""
    from tqdm import tqdm  # loaded by the commands that show a bar

    bar = tqdm(total=total, desc=description, unit=" rows", disable=None, file=sys.stderr)
    try:
        yield RowBar(bar)
    finally:
        bar.close()
