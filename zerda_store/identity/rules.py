"""Which entity a mention names: its key, its core (the key without titles and legal
suffixes), and the rule that joins a titled or suffixed form to its bare one.

Pure functions, no I/O. A mention joins an existing entity when:

1. an entity has the mention's key, or an alias with that key (``add_alias``, a merge);
2. otherwise, exactly one entity has the mention's core as its own core (from its name or
   one of its aliases), and their markers agree: "Dr. Sarah Chen" and "Sarah Chen PhD"
   join "Sarah Chen", "Acme Inc." joins "Acme Incorporated", but "Mrs. Lee" never joins
   "Mr. Lee", nor "John Smith Jr." "John Smith Sr.". Two candidates are ambiguous: the
   mention gets an entity of its own (``similar`` lists it for a person to decide).

Possessives, the Arabic article, spaces, first names and fuzzy matching cost precision:
they only suggest duplicates (:mod:`zerda_store.identity.similar`), they never join.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any

from ..model.names import EXACT, KEY_RULES, UNKNOWN_TYPE, KeyRules, fold_v2_text, word_case
from ..model.records import MENTION_KEY, Mention

# Leading titles, as fold-v2 spells them, by class: two titles of one class are one title.
_TITLE_CLASSES = {
    "mr": ("mr", "mister", "السيد"),
    "mrs": ("mrs", "السيده"),
    "ms": ("ms", "miss", "mx", "الانسه"),
    "dr": ("dr", "doctor", "د", "الدكتور", "الدكتوره", "دكتور", "دكتوره"),
    "prof": ("prof", "professor", "البروفيسور", "بروفيسور"),
    "eng": ("eng", "engr", "م", "المهندس", "المهندسه", "مهندس", "مهندسه"),
    "sheikh": ("sheikh", "shaikh", "sheikha", "shaikha", "الشيخ", "الشيخه", "شيخ", "شيخه"),
    "teacher": ("الاستاذ", "الاستاذه", "استاذ", "استاذه", "ا"),
    "sir": ("sir", "dame", "lord", "lady"),
    "rev": ("rev", "reverend", "fr", "father"),
    "he": ("he", "hh", "his excellency", "her excellency", "معالي", "سعاده", "سمو"),
    "prince": ("prince", "princess", "الامير", "الاميره", "امير", "اميره"),
    "hajj": ("الحاج", "الحاجه", "حاج", "حاجه", "haj", "hajj", "hajji"),
    "lawyer": ("المحامي", "المحاميه", "محامي", "محاميه", "atty", "attorney"),
    "royal": ("hrh", "صاحب السمو", "صاحب السمو الملكي", "صاحبه السمو", "صاحب المعالي"),
    "officer": ("ceo", "cfo", "cto", "coo", "cio", "vp", "chairman", "chairwoman"),
    "rank": ("capt", "captain", "col", "colonel", "gen", "general", "maj", "major", "lt"),
}
# Trailing post-nominals by class; a generation (Jr., Sr., III) tells two people apart.
_POST_NOMINAL_CLASSES = {
    "degree": ("phd", "md", "mba", "msc", "bsc", "cpa", "cfa", "pmp", "pe", "esq", "dds", "rn"),
    "jr": ("jr", "junior"),
    "sr": ("sr", "senior"),
    "ii": ("ii", "2nd"),
    "iii": ("iii", "3rd"),
    "iv": ("iv", "4th"),
    "honour": ("obe", "mbe", "cbe", "kbe"),
}
# Legal forms of a company: any two name one company (a US and a UK arm of one customer).
_LEGAL_SUFFIXES = (
    "inc", "incorporated", "corp", "corporation", "co", "company", "llc", "llp", "lp",
    "ltd", "limited", "plc", "gmbh", "ag", "sa", "sas", "sarl", "bv", "nv", "ab", "as",
    "oy", "spa", "srl", "pty", "kk", "pvt", "wll", "fze", "fzco", "fzc", "fzllc",
    "pjsc", "psc", "jsc", "ojsc", "saog", "saoc", "bsc(c)",
    "شمم", "ذمم", "شمع", "شمل", "شمب", "شمق", "ذ م م", "ش م م", "ش م ع", "ذات مسووليه محدوده",
)  # fmt: skip
_LEGAL_PREFIXES = ("شركه", "مءسسه")
_COMPANY = "company"  # a legal form: any two name one company


def _classes(table: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {spelling: cls for cls, spellings in table.items() for spelling in spellings}


_TITLES = _classes(_TITLE_CLASSES)
_POST_NOMINALS = _classes(_POST_NOMINAL_CLASSES)
_LONGEST_MARKER = 3  # words: "ذ م م", "صاحب السمو الملكي"
# A trailing qualifier in brackets: "Acme (UK)", "Nadia Rahman (Finance)".
_QUALIFIER = re.compile(r"^(.*\S)\s*\(([^()]+)\)\s*$")
# Markers that tell two people apart when both forms carry one of a different class.
_EXCLUSIVE = {"title", "generation", "qualifier"}
_GENERATIONS = {"jr", "sr", "ii", "iii", "iv"}


@dataclass(frozen=True)
class Identity:
    """A name's key, its core, and the markers stripped from the core."""

    key: str
    core: str
    markers: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Candidate:
    """An entity a mention may join: its key, and the names it is known by."""

    key: str
    core: str
    names: tuple[str, ...]


def mention_of(name: str, rules: KeyRules, entity_type: str = UNKNOWN_TYPE) -> Mention:
    """``name`` as a mention under ``rules``: its key, core and markers."""
    return _mention_of(name, rules.name, entity_type)


def mentions_in(entities: Sequence[Any], rules: KeyRules) -> list[Mention]:
    """One mention per key of extracted ``entities`` (each with a ``name`` and an
    ``entity_type``), in extraction order: the first form of the name, and the first type
    known for it; a name with an empty key is left out."""
    found = list(map(_mention_of, map(_NAME, entities), repeat(rules.name), map(_TYPE, entities)))
    keys = set(map(MENTION_KEY, found))
    if len(keys) == len(found) and "" not in keys:
        return found  # a key each: every turn's case, made in C
    mentions: dict[str, Mention] = {}
    for mention in found:
        first = mentions.get(mention.key)
        if first is None:
            if mention.key:
                mentions[mention.key] = mention
        elif first.entity_type == UNKNOWN_TYPE:
            mentions[mention.key] = first._replace(entity_type=mention.entity_type)
    return list(mentions.values())


_NAME = attrgetter("name")
_TYPE = attrgetter("entity_type")


@functools.lru_cache(maxsize=16384)
def _mention_of(name: str, rules_name: str, entity_type: str) -> Mention:
    identity = _identify(name, rules_name)
    return Mention(name, identity.key, entity_type, identity.core, identity.markers)


def identify(name: str, rules: KeyRules) -> Identity:
    """The identity of ``name`` under ``rules``; exact keys have no core apart."""
    return _identify(name, rules.name)


# A CRM's assistant meets the same few thousand names again and again.
@functools.lru_cache(maxsize=16384)
def _identify(name: str, rules_name: str) -> Identity:
    rules = KEY_RULES[rules_name]
    key = rules.key(name)
    if rules is EXACT:
        return Identity(key, key)
    markers: set[tuple[str, str]] = set()
    qualified = _QUALIFIER.match(name)
    if qualified:
        name = qualified.group(1)
        markers.add(("qualifier", fold_v2_text(qualified.group(2))))
    words = fold_v2_text(name).split()
    start = _strip_leading(words, markers)
    end = _strip_trailing(words, start, markers)
    if not markers or start >= end:
        return Identity(key, key)
    core = word_case(" ".join(words[start:end]), name, rules)
    return Identity(key, core, frozenset(markers))


def _strip_leading(words: list[str], markers: set[tuple[str, str]]) -> int:
    start = 0
    while start < len(words) - 1:
        for size in range(min(_LONGEST_MARKER, len(words) - 1 - start), 0, -1):
            phrase = " ".join(words[start : start + size])
            if phrase in _TITLES:
                markers.add(("title", _TITLES[phrase]))
                break
            if phrase in _LEGAL_PREFIXES:
                markers.add((_COMPANY, "prefix"))
                break
        else:
            return start
        start += size
    return start


def _strip_trailing(words: list[str], start: int, markers: set[tuple[str, str]]) -> int:
    end = len(words)
    while end - 1 > start:
        for size in range(min(_LONGEST_MARKER, end - 1 - start), 0, -1):
            phrase = " ".join(words[end - size : end])
            if phrase in _POST_NOMINALS:
                cls = _POST_NOMINALS[phrase]
                markers.add(("generation" if cls in _GENERATIONS else "degree", cls))
                break
            if phrase in _LEGAL_SUFFIXES:
                markers.add((_COMPANY, "suffix"))
                break
        else:
            return end
        end -= size
    return end


def compatible(one: Iterable[tuple[str, str]], other: Iterable[tuple[str, str]], core: str) -> bool:
    """Whether two sets of markers may name one entity: no title, generation or
    qualifier of different classes on the two sides; and "شركة" or "مؤسسة" on one side
    only if the core is two words or more: "شركة النيل" is a company, "النيل" the river,
    but "شركة الاتصالات السعودية" is "الاتصالات السعودية"."""
    mine, theirs = set(one), set(other)
    for side, bare in ((mine, theirs), (theirs, mine)):
        forms = {cls for kind, cls in side if kind == _COMPANY}
        named = any(kind == _COMPANY for kind, _ in bare)
        if forms == {"prefix"} and not named and " " not in core:
            return False
    for kind in _EXCLUSIVE:
        a = {cls for k, cls in mine if k == kind}
        b = {cls for k, cls in theirs if k == kind}
        if a and b and not a & b:
            return False
    return True


def resolve(identity: Identity, candidates: Sequence[Candidate], rules: KeyRules) -> str | None:
    """The key of the entity ``identity`` joins among ``candidates`` (entities found by
    key, alias or core), or None for a new entity."""
    for candidate in candidates:
        if identity.key == candidate.key or any(
            rules.key(name) == identity.key for name in candidate.names
        ):
            return candidate.key
    joinable = {
        candidate.key for candidate in candidates if _core_matches(identity, candidate, rules)
    }
    return joinable.pop() if len(joinable) == 1 else None


def _core_matches(identity: Identity, candidate: Candidate, rules: KeyRules) -> bool:
    forms = [identify(name, rules) for name in candidate.names]
    if not any(form.core == identity.core for form in forms):
        return False
    markers = {marker for form in forms if form.core == identity.core for marker in form.markers}
    return compatible(identity.markers, markers, identity.core)
