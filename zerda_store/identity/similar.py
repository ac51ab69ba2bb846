"""Entities that may be one: the folds that cost precision, and the variants a name goes
by (attested transliterations, nicknames, acronyms: :mod:`.variants`), used only to
suggest merges for a person to confirm (``entities --similar``), never to merge.

Pure functions. Each rule maps a name to a loose form; two entities whose loose forms
are equal under a rule are a pair, with that rule as the reason. Spelling variants are
names one edit apart (two for long names): candidates share a form with one letter
deleted, or sort near each other (forwards or backwards), and are then measured; two
names the data knows as two different names (Samir and Samira, Hamad and Hamed) are not
misspellings of one another. Variants are found by their keys (:mod:`.variants`): names
that share a reading as attested units (transliterations), a given name's nickname
family and the rest of the name (nicknames), or an acronym and a name's initials.

The work is bounded: a block of names that share a form is paired by sorted
neighbourhood (each name with the ``WINDOW`` names after it in sorted order) once it is
larger than ``WINDOW``, so a session of look-alike names costs time in proportion to
its size, not its square. Each pair has a score (0-1: how likely one entity); pairs come
best first: by score, then in first-seen order; ``limit`` keeps the first ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..model.names import EXACT, KeyRules, fold_v2_text, is_held_apart
from .rules import identify
from .variant_pairs import (
    ACRONYM_SCORE,
    WINDOW,
    acronym_pairs,
    block_pairs,
    blocks,
    distinct_names,
    nickname_pairs,
    transliteration_pairs,
)
from .variants import distinct_given_names, readings

__all__ = ["WINDOW", "Pairing", "SimilarPair", "judged_pair", "similar_pairs"]

# The Arabic article at the start of a word, after an optional conjunction or preposition.
_ARTICLE = re.compile(r"(?<!\S)ال(?=\S{2,})")
_POSSESSIVE = re.compile(r"['’ʼ]s$|s['’ʼ]$", re.IGNORECASE)

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
    score: float = 0.0


@dataclass
class Pairing:
    """What one pairing cost: the candidate pairs its blocks proposed (each measured or
    scored once), for the tests that pin its bound."""

    candidates: int = 0


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
TRANSLITERATION = "transliteration"
NICKNAME = "nickname"
ACRONYM = "acronym"
REASONS = (*(reason for reason, _ in RULES), SPELLING, FIRST_NAME)
VARIANT_REASONS = (TRANSLITERATION, NICKNAME, ACRONYM)
# How likely each reason's pairs are one entity: the order they are listed in.
SCORES = {
    "title or legal suffix": 0.95,
    "possessive": 0.9,
    "Arabic article": 0.9,
    "spacing": 0.85,
    SPELLING: 0.6,
    FIRST_NAME: 0.4,
}


def similar_pairs(
    names: Sequence[str],
    rules: KeyRules,
    limit: int | None = None,
    cores: Sequence[str] | None = None,
    *,
    rejected: Collection[tuple[str, str]] = (),
    keys: Sequence[str] | None = None,
    pairing: Pairing | None = None,
) -> list[SimilarPair]:
    """Pairs of ``names`` (one per entity, in first-seen order) that may name one
    entity, each pair once, best first; at most ``limit`` of them (None: all).
    ``cores``: the names' core keys as stored (else computed: the costliest step); a core
    held apart by an unmerge is computed from the name, so that the pair is still shown.
    ``rejected``: pairs of entity keys (``keys``, else ``rules.key`` of the names; in
    sorted order: :func:`judged_pair`) a person judged two entities: never listed."""
    if rules is EXACT:
        return []
    pairing = pairing if pairing is not None else Pairing()
    folded = [fold_v2_text(name) for name in names]
    found: dict[tuple[int, int], tuple[float, str]] = {}

    def keep(pair: tuple[int, int], score: float, reason: str) -> None:
        pairing.candidates += 1
        if folded[pair[0]] != folded[pair[1]] and found.get(pair, (0.0, ""))[0] < score:
            found[pair] = (score, reason)

    for reason, loose in RULES:
        if loose is _core and cores is not None:
            forms: Iterable[str] = (
                identify(name, rules).core if is_held_apart(core) else core
                for name, core in zip(names, cores, strict=True)
            )
        else:
            forms = (loose(name, text, rules) for name, text in zip(names, folded, strict=True))
        for members in blocks(forms).values():
            for pair in block_pairs(members, folded):
                keep(pair, SCORES[reason], reason)
    read = [readings(name) for name in names]
    for pair in _spelling_pairs(folded):
        if not distinct_names(read[pair[0]], read[pair[1]]) and not distinct_given_names(
            folded[pair[0]], folded[pair[1]]
        ):
            keep(pair, SCORES[SPELLING], SPELLING)
    for pair in _first_name_pairs(folded):
        keep(pair, SCORES[FIRST_NAME], FIRST_NAME)
    for pair, score in transliteration_pairs(read, folded):
        keep(pair, score, TRANSLITERATION)
    for pair, score in nickname_pairs(folded):
        keep(pair, score, NICKNAME)
    for pair in acronym_pairs(names, cores, folded, rules):
        keep(pair, ACRONYM_SCORE, ACRONYM)
    if rejected:
        refused = set(rejected)

        def key(index: int) -> str:
            return keys[index] if keys is not None else rules.key(names[index])

        found = {
            pair: value
            for pair, value in found.items()
            if judged_pair(key(pair[0]), key(pair[1])) not in refused
        }
    best = sorted(found.items(), key=lambda item: (-item[1][0], item[0]))
    return [
        SimilarPair(names[i], names[j], reason, round(score, 2))
        for (i, j), (score, reason) in best[:limit]
    ]


def judged_pair(key_a: str, key_b: str) -> tuple[str, str]:
    """Two entities' keys as a judgement records them: in sorted order."""
    return (key_a, key_b) if key_a <= key_b else (key_b, key_a)


def _first_name_pairs(folded: Sequence[str]) -> Iterator[tuple[int, int]]:
    """A first name with a full name that starts with it ("Sarah", "Sarah Chen"), never
    two full names that share one ("Sarah Chen", "Sarah Miller")."""
    words = blocks(text.split(" ")[0] for text in folded)
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
            candidates.update(block_pairs(members, folded))
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
