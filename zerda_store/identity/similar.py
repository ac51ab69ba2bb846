"""Entities that may be one: the folds that cost precision, used only to suggest merges
for a person to confirm (``entities --similar``), never to merge.

Pure functions. Each rule maps a name to a loose form; two entities whose loose forms
are equal under a rule are a pair, with that rule as the reason. Spelling variants are
found by edit distance among names that share their first letter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..model.names import EXACT, KeyRules, fold_v2_text
from .rules import identify

# The Arabic article at the start of a word, after an optional conjunction or preposition.
_ARTICLE = re.compile(r"(?<!\S)ال(?=\S{2,})")
_POSSESSIVE = re.compile(r"['’ʼ]s$|s['’ʼ]$", re.IGNORECASE)


@dataclass(frozen=True)
class SimilarPair:
    """Two entities' names, and why they may be one."""

    a: str
    b: str
    reason: str


def _core(name: str, rules: KeyRules) -> str:
    return identify(name, rules).core


def _possessive(name: str, _rules: KeyRules) -> str:
    return fold_v2_text(_POSSESSIVE.sub("", name.strip()))


def _article(name: str, _rules: KeyRules) -> str:
    return _ARTICLE.sub("", fold_v2_text(name))


def _spacing(name: str, _rules: KeyRules) -> str:
    return fold_v2_text(name).replace(" ", "").replace("-", "")


def _first_name(name: str, _rules: KeyRules) -> str:
    return fold_v2_text(name).split(" ")[0]


RULES: tuple[tuple[str, Callable[[str, KeyRules], str]], ...] = (
    ("title or legal suffix", _core),
    ("possessive", _possessive),
    ("Arabic article", _article),
    ("spacing", _spacing),
    ("first name", _first_name),
)


def similar_pairs(names: Sequence[str], rules: KeyRules) -> list[SimilarPair]:
    """Pairs of ``names`` (one per entity) that may name one entity, each pair once, in
    the order the names come."""
    if rules is EXACT:
        return []
    found: dict[tuple[int, int], str] = {}
    for reason, loose in RULES:
        groups: dict[str, list[int]] = {}
        for index, name in enumerate(names):
            form = loose(name, rules)
            if form:
                groups.setdefault(form, []).append(index)
        for members in groups.values():
            for pair in _pairs(members):
                if reason != "first name" or _one_word(names, pair):
                    found.setdefault(pair, reason)
    for pair in _spelling_pairs(names):
        found.setdefault(pair, "spelling")
    return [SimilarPair(names[i], names[j], reason) for (i, j), reason in sorted(found.items())]


def _one_word(names: Sequence[str], pair: tuple[int, int]) -> bool:
    """A first name pairs with a full name ("Sarah", "Sarah Chen"), not two full names
    that share one ("Sarah Chen", "Sarah Miller")."""
    return min(len(fold_v2_text(names[i]).split()) for i in pair) == 1


def _pairs(members: list[int]) -> Iterable[tuple[int, int]]:
    return ((a, b) for n, a in enumerate(members) for b in members[n + 1 :])


def _spelling_pairs(names: Sequence[str]) -> Iterable[tuple[int, int]]:
    """Names one edit apart (two for names of ten letters or more), five letters or more."""
    folded = [fold_v2_text(name) for name in names]
    by_initial: dict[str, list[int]] = {}
    for index, text in enumerate(folded):
        if len(text) >= 5:
            by_initial.setdefault(text[0], []).append(index)
    for members in by_initial.values():
        for a, b in _pairs(members):
            limit = 2 if min(len(folded[a]), len(folded[b])) >= 10 else 1
            if folded[a] != folded[b] and _within(folded[a], folded[b], limit):
                yield a, b


def _within(a: str, b: str, limit: int) -> bool:
    """Whether the edit distance of ``a`` and ``b`` is at most ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return False
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if min(current) > limit:
            return False
        previous = current
    return previous[-1] <= limit
