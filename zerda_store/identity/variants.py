"""Name variants that one entity goes by: attested transliterations, nicknames and
acronyms, from the data files of ``zerda_store/lexicon/variants`` (read once, on first
need; see its README for their sources and licences).

Pure functions. Each one maps a name to its *variant keys*: two names that share a key
may name one entity (``similar`` pairs them, for a person to confirm; nothing here ever
merges). A key carries the weight of the evidence behind it.

The data files, one relation a line, tab-separated:

- ``spellings*.tsv[.gz]`` and ``places*.tsv[.gz]``: a name in its own script (Arabic
  first), then its attested Latin spellings, each optionally followed by its weight
  (the share of that spelling's attestations that are of this name, 0-1). Two Latin
  spellings of one name, or a name and one of its spellings, are transliterations.
- ``nicknames*.tsv[.gz]``: a given name, then its nicknames or short forms (a trailing
  number column is a weight, ignored).

Another language's variants are another file of either kind. The forms of a ``.tsv``
file are folded with fold-v2 and written without spaces when read; a ``.tsv.gz`` file
(built by ``scripts/build-name-variants``) holds them so already.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from importlib import resources

from ..model.names import fold_v2_text

# A Latin spelling's weight for a name below this is too weak to pair on.
MIN_WEIGHT = 0.3
# How many words at most one attested unit spans ("abd al rahman", "ras al khaimah").
_LONGEST_UNIT = 4
# How many readings of one name are kept (the strongest first): the blocking stays small.
_MOST_READINGS = 8
_MOST_PER_WORD = 3
# Words left out of an acronym ("Bank of America" is BoA or BA).
_STOPWORDS = frozenset(
    ["and", "&", "of", "the", "for", "de", "du", "des", "la", "le", "et", "di", "da", "del", "van", "von"]
)  # fmt: skip
_ARABIC = re.compile("[\u0600-\u06ff]")
# A folded word with a letter outside a-z is written in its own script (Arabic, Greek...).
_OWN_SCRIPT = re.compile(r"[^\W\da-z_]")
_LATIN_WORD = re.compile("[a-z]+")
_WEIGHT = re.compile(r"[01](?:\.\d+)?")
_ACRONYM = re.compile(r"[a-z][a-z0-9&]{1,7}")


@dataclass
class VariantData:
    """The variant relations of every data file, by folded form."""

    # Latin spelling → {name in its own script: weight}.
    spellings: dict[str, dict[str, float]] = field(default_factory=dict)
    # Names in their own script that the data knows.
    script_names: set[str] = field(default_factory=set)
    # Given name → the names it is a nickname of or has as a nickname.
    nicknames: dict[str, set[str]] = field(default_factory=dict)

    def add_spelling(self, script_name: str, latin: str, weight: float) -> None:
        if not script_name or not latin:
            return
        self.script_names.add(script_name)
        known = self.spellings.setdefault(latin, {})
        known[script_name] = max(weight, known.get(script_name, 0.0))

    def add_nickname(self, name: str, nickname: str) -> None:
        if name and nickname and name != nickname:
            self.nicknames.setdefault(name, set()).add(nickname)
            self.nicknames.setdefault(nickname, set()).add(name)


def _joined(form: str) -> str:
    return fold_v2_text(form).replace(" ", "")


def _rows(text: str) -> Iterator[list[str]]:
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            yield [column.strip() for column in line.split("\t") if column.strip()]


def _weighted(columns: list[str]) -> Iterator[tuple[str, float]]:
    """The forms of a row's columns after the first, each with the weight that follows
    it (1 when none does)."""
    forms: list[tuple[str, float]] = []
    for column in columns:
        if not _WEIGHT.fullmatch(column):
            forms.append((column, 1.0))
        elif forms:
            forms[-1] = (forms[-1][0], float(column))
    yield from forms


def load(data: VariantData, name: str, text: str, *, folded: bool = False) -> None:
    """Read one data file's ``text`` into ``data``; its kind comes from its ``name``.
    ``folded``: its forms are folded already (the built files), else they are folded."""
    kind = name.split(".")[0].split("-")[0]
    fold = str if folded else _joined
    for columns in _rows(text):
        head = fold(columns[0])
        for form, weight in _weighted(columns[1:]):
            if kind in ("spellings", "places"):
                data.add_spelling(head, fold(form), weight)
            elif kind == "nicknames":
                data.add_nickname(head, fold(form))


@functools.cache
def variant_data() -> VariantData:
    """Every data file of the package's ``lexicon/variants`` folder, read once."""
    data = VariantData()
    folder = resources.files("zerda_store.lexicon").joinpath("variants")
    for entry in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if entry.name.endswith(".tsv.gz"):
            # Built by scripts/build-name-variants, folded already.
            load(data, entry.name, gzip.decompress(entry.read_bytes()).decode(), folded=True)
        elif entry.name.endswith(".tsv"):
            load(data, entry.name, entry.read_text(encoding="utf-8"))
    return data


# -- transliteration ----------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One reading of a name as attested units: the key it shares with its other
    spellings, and how sure the weakest unit of it is."""

    key: tuple[str, ...]
    weight: float
    complete: bool  # every unit attested


def _units(words: list[str], known: Collection[str]) -> Iterator[str]:
    """The words, with the longest runs of them that the data knows written as one."""
    start = 0
    while start < len(words):
        for end in range(min(len(words), start + _LONGEST_UNIT), start, -1):
            joined = "".join(words[start:end])
            if end - start == 1 or joined in known:
                yield joined
                start = end
                break


def _options(unit: str, data: VariantData) -> list[tuple[str, float, bool]]:
    """The names in their own script one unit may be: (name, weight, attested)."""
    if _OWN_SCRIPT.search(unit):
        if unit in data.script_names:
            return [(unit, 1.0, True)]
        bare = unit[2:] if unit.startswith("ال") else ""
        if bare in data.script_names:
            return [(bare, 1.0, True)]
        return [(unit, 1.0, False)]
    found = data.spellings.get(unit)
    if not found:
        return [("=" + unit, 1.0, False)]
    strongest = sorted(found.items(), key=lambda item: (-item[1], item[0]))
    return [(name, weight, True) for name, weight in strongest[:_MOST_PER_WORD]]


def readings(name: str) -> list[Reading]:
    """The attested readings of ``name``: each unit (a word, or the longest run of words
    the data knows as one) read as the names it is an attested spelling of. Two names
    sharing a reading's key are transliterations of one another. None for a name with
    no attested unit."""
    data = variant_data()
    folded = fold_v2_text(name)
    words = folded.replace("&", " ").split()
    if not words:
        return []
    known = data.spellings if not _OWN_SCRIPT.search(folded) else data.script_names
    options = [_options(unit, data) for unit in _units(words, known)]
    if not any(attested for choices in options for _, _, attested in choices):
        return []
    found: list[Reading] = []
    for combination in itertools.islice(itertools.product(*options), _MOST_READINGS):
        weight = min(weight for _, weight, _ in combination)
        if weight >= MIN_WEIGHT:
            complete = all(attested for _, _, attested in combination)
            found.append(Reading(tuple(unit for unit, _, _ in combination), weight, complete))
    return found


# -- nicknames ----------------------------------------------------------------------------


def given_and_rest(folded: str) -> tuple[str, str]:
    """A folded name's first word, and the words after it."""
    given, _, rest = folded.partition(" ")
    return given, rest


def nickname_keys(folded: str) -> set[str]:
    """The given names that ``folded``'s first word is a nickname of, has as a nickname,
    or is: the keys of its nickname block (with the rest of the name appended)."""
    given, rest = given_and_rest(folded)
    related = variant_data().nicknames.get(given)
    if not related or not _LATIN_WORD.fullmatch(given):
        return set()
    return {f"{name} {rest}" for name in (*related, given)}


def nickname_link(a: str, b: str) -> str | None:
    """How the first words of two folded names are related: "nickname" (one is a
    nickname of the other), "same name" (both are nicknames of a longer given name:
    Peggy and Maggie of Margaret), or None."""
    nicknames = variant_data().nicknames
    one, two = given_and_rest(a)[0], given_and_rest(b)[0]
    if one == two:
        return None
    if two in nicknames.get(one, ()):
        return "nickname"
    shared = nicknames.get(one, set()) & nicknames.get(two, set())
    if any(len(hub) > max(len(one), len(two)) for hub in shared):
        return "same name"
    return None


def distinct_given_names(a: str, b: str) -> bool:
    """Whether two folded names start with two different given names the nickname data
    knows and does not relate (Alexander and Alexandra, Christopher and Christine)."""
    nicknames = variant_data().nicknames
    one, two = given_and_rest(a)[0], given_and_rest(b)[0]
    return one != two and one in nicknames and two in nicknames and nickname_link(a, b) is None


# -- acronyms -----------------------------------------------------------------------------


def acronym_of(name: str) -> str | None:
    """The letters of ``name`` if it is written as an acronym ("HSBC", "P&G", "H.S.B.C.",
    "D365"): one word of two to eight letters or digits, starting with a letter, at least
    two capital letters and no small ones; else None."""
    letters = [ch for ch in name if ch.isalpha()]
    if " " in name.strip() or not letters or any(ch.islower() for ch in letters):
        return None
    if sum(ch.isupper() for ch in letters) < 2 and not any(ch.isdigit() for ch in name):
        return None
    folded = fold_v2_text(name).replace(" ", "")
    if not _ACRONYM.fullmatch(folded):
        return None
    return folded.replace("&", "")


def initials(name: str, core: str) -> set[str]:
    """The acronyms a name of several words may go by: the first letter of each word (a
    word written in capitals or of digits whole: "Emirates NBD" is ENBD, "Dynamics 365"
    D365), with and without the small words ("and", "of") and its legal form."""
    found = set()
    for text in {name, core}:
        words = re.split(r"[\s\-/]+|(?<=\S)&|&(?=\S)", text.strip())
        words = [word.strip(".,()'’") for word in words if word.strip(".,()'’")]
        if len(words) < 2 or any(_ARABIC.search(word) for word in words):
            continue
        parts = [_initial(word) for word in words]
        found.add("".join(part for part, _ in parts))
        found.add("".join(part for part, word in parts if word.casefold() not in _STOPWORDS))
    return {acronym for acronym in found if len(acronym) >= 2}


def _initial(word: str) -> tuple[str, str]:
    letters = [ch for ch in word if ch.isalpha()]
    if word.isdigit() or (len(letters) >= 2 and all(ch.isupper() for ch in letters)):
        return fold_v2_text(word).replace("&", ""), word
    return (fold_v2_text(word)[:1] if word != "&" else ""), word
