"""Test doubles shared by the suites."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable


class KeywordLLM:
    """A stand-in LLM: answers with the known names that occur in the prompt's text, in
    order of first occurrence, comma-separated, like a well-behaved extraction model."""

    def __init__(self, vocabulary: Iterable[str], *, extra: str = "") -> None:
        self.vocabulary = sorted(set(vocabulary), key=len, reverse=True)
        self.extra = extra
        self.calls = 0
        self._lock = threading.Lock()

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        with self._lock:
            self.calls += 1
        found: list[tuple[int, str]] = []
        taken: list[range] = []
        for name in self.vocabulary:
            for match in re.finditer(re.escape(name), prompt):
                span = range(match.start(), match.end())
                if not any(span.start < t.stop and t.start < span.stop for t in taken):
                    taken.append(span)
                    found.append((match.start(), name))
        names: list[str] = []
        for _, name in sorted(found):
            if name not in names:
                names.append(name)
        return ", ".join(names) + self.extra


class FixedLLM:
    """Always gives the same answer, like the original documentation's example model."""

    def __init__(self, response: str) -> None:
        self.response = response
        self.calls = 0

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        self.calls += 1
        return self.response


class BrokenLLM:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error or RuntimeError("timeout")
        self.calls = 0

    def generate(self, prompt: str, max_tokens: int = 256) -> str:
        self.calls += 1
        raise self.error
