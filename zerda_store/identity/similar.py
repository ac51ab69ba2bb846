"""Entities that may be one: the folds that cost precision, used only to suggest merges
for a person to confirm (``entities --similar``), never to merge.

Pure functions. Each rule maps a name to a loose form; two entities whose loose forms
are equal under a rule are a pair, with that rule as the reason. Spelling variants are
names one edit apart (two for long names): candidates share a form with one letter
deleted, or sort near each other (forwards or backwards), and are then measured.

The work is bounded: a block of names that share a form is paired by sorted
neighbourhood (each name with the ``WINDOW`` names after it in sorted order) once it is
larger than ``WINDOW``, so a session of look-alike names costs time in proportion to
its size, not its square. Pairs come best first: by the strength of their reason, then
in first-seen order; ``limit`` keeps the first ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..model.names import EXACT, KeyRules, fold_v2_text
from .rules import identify

# The Arabic article at the start of a word, after an optional conjunction or preposition.
_ARTICLE = re.compile(r"(?<!\S)ال(?=\S{2,})")
_POSSESSIVE = re.compile(r"['’ʼ]s$|s['’ʼ]$", re.IGNORECASE)

# How many neighbours (in sorted order) each name of a large block is paired with.
WINDOW = 8
# How many neighbours a long name is measured against in each sorted order.
NEIGHBOURS = 4
# Names shorter than this are not compared by spelling; from LONG on, two edits count.
SHORTEST = 5
LONG = 10


@dataclass(frozen=True)
class SimilarPair:
    """Two entities' names, and why they may be one."""

    a: str
    b: str
    reason: str


def _core(name: str, _folded: str, rules: KeyRules) -> str:
    return identify(name, rules).core


def _possessive(name: str, folded: str, _rules: KeyRules) -> str:
    stripped = name.strip()
    bare = _POSSESSIVE.sub("", stripped)
    return folded if bare == stripped else fold_v2_text(bare)


def _article(_name: str, folded: str, _rules: KeyRules) -> str:
    return _ARTICLE.sub("", folded)


def _spacing(_name: str, folded: str, _rules: KeyRules) -> str:
    return folded.replace(" ", "").replace("-", "")


# Strongest first: the order pairs are listed in (spelling comes before "first name").
RULES: tuple[tuple[str, Callable[[str, str, KeyRules], str]], ...] = (
    ("title or legal suffix", _core),
    ("possessive", _possessive),
    ("Arabic article", _article),
    ("spacing", _spacing),
)
SPELLING = "spelling"
FIRST_NAME = "first name"
REASONS = (*(reason for reason, _ in RULES), SPELLING, FIRST_NAME)


def similar_pairs(
    names: Sequence[str], rules: KeyRules, limit: int | None = None
) -> list[SimilarPair]:
    """Pairs of ``names`` (one per entity, in first-seen order) that may name one
    entity, each pair once, best first; at most ``limit`` of them (None: all)."""
    if rules is EXACT:
        return []
    folded = [fold_v2_text(name) for name in names]
    found: dict[tuple[int, int], int] = {}
    for rank, (_reason, loose) in enumerate(RULES):
        forms = (loose(name, text, rules) for name, text in zip(names, folded, strict=True))
        for members in _blocks(forms).values():
            for pair in _block_pairs(members, folded):
                found.setdefault(pair, rank)
    for pair in _spelling_pairs(folded):
        found.setdefault(pair, REASONS.index(SPELLING))
    for pair in _first_name_pairs(folded):
        found.setdefault(pair, REASONS.index(FIRST_NAME))
    best = sorted(found.items(), key=lambda item: (item[1], item[0]))
    return [SimilarPair(names[i], names[j], REASONS[rank]) for (i, j), rank in best[:limit]]


def _blocks(forms: Iterable[str]) -> dict[str, list[int]]:
    """The indexes of the non-empty forms, by form."""
    blocks: dict[str, list[int]] = {}
    for index, form in enumerate(forms):
        if form:
            blocks.setdefault(form, []).append(index)
    return blocks


def _block_pairs(members: list[int], folded: Sequence[str]) -> Iterator[tuple[int, int]]:
    """Every pair of a small block; in a large one, each name with the ``WINDOW`` names
    that follow it in sorted order (sorted neighbourhood)."""
    if len(members) <= WINDOW + 1:
        for n, a in enumerate(members):
            for b in members[n + 1 :]:
                yield a, b
        return
    ordered = sorted(members, key=lambda index: (folded[index], index))
    for n, a in enumerate(ordered):
        for b in ordered[n + 1 : n + 1 + WINDOW]:
            yield min(a, b), max(a, b)


def _first_name_pairs(folded: Sequence[str]) -> Iterator[tuple[int, int]]:
    """A first name with a full name that starts with it ("Sarah", "Sarah Chen"), never
    two full names that share one ("Sarah Chen", "Sarah Miller")."""
    words = _blocks(text.split(" ")[0] for text in folded)
    for members in words.values():
        single = [i for i in members if " " not in folded[i]]
        for a in single:
            for b in members:
                if b != a and " " in folded[b]:
                    yield min(a, b), max(a, b)


def _spelling_pairs(folded: Sequence[str]) -> Iterator[tuple[int, int]]:
    """Names of ``SHORTEST`` letters or more one edit apart (two when both have ``LONG``
    or more), the edits not touching digits ("Account 12" and "Account 13", "F-150" and
    "F-250" are other things, not misspellings). Candidates: short names that share a
    form with one letter deleted (every such pair one letter-edit apart does), and long
    names that sort near each other forwards or backwards (found unless a dense block of
    look-alikes lies between them)."""
    measurable = [i for i, text in enumerate(folded) if len(text) >= SHORTEST]
    deletions: dict[str, list[int]] = {}
    for index in measurable:
        text = folded[index]
        if len(text) > LONG:  # longer ones meet their look-alikes by sorted neighbourhood
            continue
        cuts = {text[:k] + text[k + 1 :] for k in range(len(text)) if not text[k].isdigit()}
        for cut in cuts | {text}:
            deletions.setdefault(cut, []).append(index)
    candidates: set[tuple[int, int]] = set()
    for members in deletions.values():
        if len(members) > 1:
            candidates.update(_block_pairs(members, folded))
    long_names = [i for i in measurable if len(folded[i]) >= LONG]  # (LONG: both ways)
    for key in (lambda i: folded[i], lambda i: folded[i][::-1]):
        ordered = sorted(long_names, key=key)
        for n, a in enumerate(ordered):
            following = ordered[n + 1 : n + 1 + NEIGHBOURS]
            candidates.update((min(a, b), max(a, b)) for b in following)
    for a, b in sorted(candidates):
        limit = 2 if min(len(folded[a]), len(folded[b])) >= LONG else 1
        if _within(folded[a], folded[b], limit):
            yield a, b


def _within(a: str, b: str, limit: int) -> bool:
    """Whether ``a`` and ``b`` differ, by at most ``limit`` edits, none of them touching
    a digit (a digit edited, added or dropped, or a character next to one). Look-alikes
    share most of their text: the common prefix and suffix are dropped first, and only
    the band of cells within ``limit`` of the diagonal of what is left is computed."""
    if abs(len(a) - len(b)) > limit:
        return False
    start = 0
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1
    end = 0
    while end < len(a) - start and end < len(b) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    edges = a[start - 1 : start] + a[len(a) - end : len(a) - end + 1]
    a, b = a[start : len(a) - end], b[start : len(b) - end]
    if not (a or b) or any(c.isdigit() for c in a + b + edges):
        return False  # the same text, or other digits ("12A", "12B"): not a misspelling
    if min(len(a), len(b)) == 0 or max(len(a), len(b)) <= limit:
        return max(len(a), len(b)) <= limit
    outside = limit + 1
    previous = [j if j <= limit else outside for j in range(len(b) + 1)]
    for i, ca in enumerate(a, 1):
        low, high = max(1, i - limit), min(len(b), i + limit)
        current = [outside] * (len(b) + 1)
        current[0] = i if i <= limit else outside
        best = current[0]
        for j in range(low, high + 1):
            cost = previous[j - 1] + (ca != b[j - 1])
            if previous[j] + 1 < cost:
                cost = previous[j] + 1
            if current[j - 1] + 1 < cost:
                cost = current[j - 1] + 1
            current[j] = cost
            if cost < best:
                best = cost
        if best > limit:
            return False
        previous = current
    return previous[-1] <= limit
