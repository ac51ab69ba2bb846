"""Candidate pairs by blocking: names that share a key are paired, a large block by
sorted neighbourhood; and the pairs of the variant keys (:mod:`.variants`):
transliterations, nicknames and acronyms, each with its score. Pure functions, for
:mod:`.similar`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ..model.names import KeyRules, fold_v2_text, is_held_apart
from .rules import identify
from .variants import Reading, acronym_of, initials, nickname_keys, nickname_link

# How many neighbours (in sorted order) each name of a large block is paired with.
WINDOW = 8
# A transliteration's score: this much, and the weakest attestation's share of the rest.
_TRANSLITERATION_FLOOR = 0.5
_TRANSLITERATION_SPAN = 0.4
NICKNAME_SCORES = {("nickname", True): 0.75, ("same name", True): 0.65,
                   ("nickname", False): 0.5, ("same name", False): 0.45}  # fmt: skip
ACRONYM_SCORE = 0.7


def blocks(forms: Iterable[str]) -> dict[str, list[int]]:
    """The indexes of the non-empty forms, by form."""
    blocks: dict[str, list[int]] = {}
    for index, form in enumerate(forms):
        if form:
            blocks.setdefault(form, []).append(index)
    return blocks


def block_pairs(members: list[int], folded: Sequence[str]) -> Iterator[tuple[int, int]]:
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


def distinct_names(one: list[Reading], other: list[Reading]) -> bool:
    """Whether the data knows both names, unit by unit, as different names (Samir and
    Samira, Hamad and Hamed): then one is no misspelling of the other."""
    complete = [r.key for r in one if r.complete], [r.key for r in other if r.complete]
    return all(complete) and not set(complete[0]) & set(complete[1])


def transliteration_pairs(
    read: Sequence[list[Reading]], folded: Sequence[str]
) -> Iterator[tuple[tuple[int, int], float]]:
    """Names sharing a reading as attested units, scored by the weakest attestation."""
    weights: dict[tuple[str, ...], dict[int, float]] = {}
    for index, found in enumerate(read):
        for reading in found:
            block = weights.setdefault(reading.key, {})
            block[index] = max(reading.weight, block.get(index, 0.0))
    for block in weights.values():
        if len(block) > 1:
            for a, b in block_pairs(list(block), folded):
                weight = min(block[a], block[b])
                yield (a, b), _TRANSLITERATION_FLOOR + _TRANSLITERATION_SPAN * weight


def nickname_pairs(folded: Sequence[str]) -> Iterator[tuple[tuple[int, int], float]]:
    """Names whose first words are a name and its nickname (or two nicknames of one
    name) and whose other words are the same (or both absent)."""
    keyed = blocks_of_many((index, nickname_keys(text)) for index, text in enumerate(folded))
    for members in keyed.values():
        for a, b in block_pairs(members, folded):
            link = nickname_link(folded[a], folded[b])
            if link is not None:
                yield (a, b), NICKNAME_SCORES[link, " " in folded[a]]


def acronym_pairs(
    names: Sequence[str], cores: Sequence[str] | None, folded: Sequence[str], rules: KeyRules
) -> Iterator[tuple[int, int]]:
    """An acronym ("HSBC") with a name of several words whose initials it is."""
    acronyms: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        acronym = acronym_of(name)
        if acronym is not None:
            acronyms.setdefault(acronym, []).append(index)
    if not acronyms:
        return
    for index, name in enumerate(names):
        if len(name.split()) < 2 and "&" not in name:
            continue
        core = cores[index] if cores is not None and not is_held_apart(cores[index]) else None
        shown_core = identify(name, rules).core if core is None or core != folded[index] else name
        for letters in initials(name, _core_as_written(name, shown_core)):
            for other in acronyms.get(letters, ())[: WINDOW + 1]:
                yield min(index, other), max(index, other)


def _core_as_written(name: str, core: str) -> str:
    """The words of ``name`` its core keeps, as written (the initials need their case)."""
    kept = set(core.split()) if core else set()
    words = [word for word in name.split() if fold_v2_text(word) in kept]
    return " ".join(words) if words else name


def blocks_of_many(keyed: Iterable[tuple[int, set[str]]]) -> dict[str, list[int]]:
    """The indexes, by each of their keys."""
    blocks: dict[str, list[int]] = {}
    for index, keys in keyed:
        for key in keys:
            blocks.setdefault(key, []).append(index)
    return blocks
