"""The key rules fold-v1 and fold-v2 as revision 0006 re-keys with them, frozen.

A copy of the rules as the library defined them when 0006 was written (names.py and
identity.py), so that this revision keeps doing what it did however the library's modules
move or change. Key rules are named and frozen: this file is never edited; a change of
rules is new rules, a new name and a new revision. The list of English words in lower
case is the library's packaged data (``zerda_store/lexicon``, frozen with fold-v2).
"""

from __future__ import annotations

import functools
import gzip
import re
import unicodedata
from importlib import resources

# Arabic harakat, Quranic annotation marks, superscript alef, and tatweel.
_ARABIC_MARKS = re.compile("[\u0610-\u061a\u064b-\u065f\u0670\u06d6-\u06ed\u0640]")
_ALEF_FORMS = str.maketrans(
    {"\u0623": "\u0627", "\u0625": "\u0627", "\u0622": "\u0627", "\u0671": "\u0627"}
)

# -- fold-v2 ------------------------------------------------------------------------------
# Each fold below was measured on the labelled pairs (benchmarks/identity.py) before it
# was adopted; the folds that cost precision (possessives, the article ال, spaces, first
# names, fuzzy matching) are not here: they only suggest duplicates (``similar.py``).

# Format characters: zero-width (non-)joiners and spaces, direction marks and embeddings,
# the soft hyphen, the byte-order mark.
_INVISIBLE = re.compile(
    r"[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]"
)
# Spelling variants of one letter in Arabic-script names: ta marbuta and the Persian/Urdu
# he forms as ه, alef maqsura and Persian ye as ي, Persian kaf as ك, and a hamza on a
# seat of waw or ya as the seat alone (مؤمن/مومن, رائد/رايد: the hamza is often not
# written; a hamza on the line, ء, stays: علاء and علا are two names).
_ARABIC_LETTERS = str.maketrans(
    {
        "\u0629": "\u0647",  # ة → ه
        "\u06c3": "\u0647",  # ۃ → ه
        "\u06c1": "\u0647",  # ہ → ه
        "\u06c0": "\u0647",  # ۀ → ه
        "\u06d5": "\u0647",  # ە → ه
        "\u0649": "\u064a",  # ى → ي
        "\u06cc": "\u064a",  # ی → ي
        "\u06a9": "\u0643",  # ک → ك
        "\u0624": "\u0648",  # ؤ → و
        "\u0626": "\u064a",  # ئ → ي
        "\u066b": ".",  # Arabic decimal separator
        "\u066c": ",",  # Arabic thousands separator
    }
)
# Latin letters that do not decompose into a letter and an accent.
_LATIN_LETTERS = str.maketrans(
    {"ø": "o", "đ": "d", "ł": "l", "ı": "i", "æ": "ae", "œ": "oe", "þ": "th", "ħ": "h"}
)
# Cyrillic and Greek letters that look Latin, taken as Latin in a word that mixes them
# with Latin letters ("Сareem" with a Cyrillic С is a spoof of "Careem"; "МТС" is not).
_LOOKALIKES = str.maketrans(
    dict(zip("асеорхуіјѕкмнтвαβεικνορτυχ", "aceopxyijskmhtbabeiknoptux", strict=True))
)
_LATIN = re.compile("[a-z]")
_CYRILLIC_OR_GREEK = re.compile("[\u0370-\u03ff\u0400-\u04ff]")
# Latin (and Greek, Cyrillic) accents once decomposed: é → e, ü → u. Not Arabic marks
# (folded above), nor the marks of scripts where they are letters' vowels.
_LATIN_ACCENTS = re.compile("[\u0300-\u036f]")
# Marks written as apostrophes, dropped before NFKC makes "´" a space and an accent.
_APOSTROPHES = re.compile("['`´‘’‛ʼʻ]")
# A period that is no decimal point, a comma that is no thousands separator, and the
# semicolon and colon: word separators ("Dr.Rania", "Initech, Inc.").
_SEPARATORS = re.compile(r"(?<!\d)[.,]|[.,](?!\d)|[;:،؛]")
# Quotes, brackets, and the exclamation and question marks: never tell two names apart.
_DROPPED = re.compile(r"[\"“”„‟‚‹›«»()\[\]{}!?¡¿؟]")
# Joiners written with or without spaces: "Al-Rajhi" is "Al Rajhi", "AC/DC" is "AC DC";
# next to a digit a hyphen joins: "F-150" is "F150".
_DIGIT_HYPHEN = re.compile(r"(?<=\d)[-‐‑‒–](?=\w)|(?<=\w)[-‐‑‒–](?=\d)")
_JOINERS = re.compile(r"[-‐‑‒–—―_/\\]")
# "AT & T" is "AT&T", "Procter and Gamble" "Procter & Gamble".
_AMPERSAND = re.compile(r"\s*&\s*|\s+and\s+(?=\S)")
# Initials: "J. P. Morgan", "J.P. Morgan" and "JP Morgan" are one.
_INITIALS = re.compile(r"(?<![^\s])([a-z])\s+(?=[a-z](?:\s|$))")
# Arabic compound names written with or without their space: عبد الله, أبو ظبي, نور الدين.
_ARABIC_COMPOUNDS = re.compile(r"(?<!\S)(عبد|ابو)\s+(?=\S)|()\s+(?=(?:الدين|الله)(?!\S))")


@functools.cache
def _lowercase_words() -> frozenset[str]:
    """English words spelt in lower case (see ``lexicon/README.md``)."""
    data = resources.files("zerda_store.lexicon").joinpath("english-lowercase-words.txt.gz")
    return frozenset(gzip.decompress(data.read_bytes()).decode().split())


def _fold_v1(name: str) -> str:
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _ARABIC_MARKS.sub("", text).translate(_ALEF_FORMS)
    return " ".join(text.split())


def fold_v2_text(name: str) -> str:
    """fold-v2 without its word rule: what the key is made of, word by word."""
    text = _APOSTROPHES.sub("", _INVISIBLE.sub("", name))
    text = unicodedata.normalize("NFKC", text)
    text = "".join(str(unicodedata.decimal(ch)) if ch.isdecimal() else ch for ch in text)
    text = _LATIN_ACCENTS.sub("", unicodedata.normalize("NFD", text.casefold()))
    text = unicodedata.normalize("NFC", text).translate(_LATIN_LETTERS)
    text = _ARABIC_MARKS.sub("", text).translate(_ALEF_FORMS).translate(_ARABIC_LETTERS)
    text = " ".join(_unspoofed(word) for word in _SEPARATORS.sub(" ", text).split())
    text = _JOINERS.sub(" ", _DIGIT_HYPHEN.sub("", _DROPPED.sub("", text)))
    text = _AMPERSAND.sub("&", " ".join(text.split()))
    return _ARABIC_COMPOUNDS.sub(r"\1", _INITIALS.sub(r"\1", text))


def _unspoofed(word: str) -> str:
    if _LATIN.search(word) and _CYRILLIC_OR_GREEK.search(word):
        return word.translate(_LOOKALIKES)
    return word


def _fold_v2(name: str, *, keep_words_apart: bool) -> str:
    key = fold_v2_text(name)
    if keep_words_apart and _is_word(key) and not _is_lower_case(name):
        # "Bill" (or "BILL") is a name; "bill" typed in lower case is the word.
        return key.capitalize()
    return key


def _is_word(key: str) -> bool:
    return key.isascii() and key.isalpha() and key in _lowercase_words()


def _is_lower_case(name: str) -> bool:
    return not any(ch.isupper() for ch in name)


def fold_v1(name: str) -> str:
    """The key that releases up to revision 0005 made (``normalize_names=True``)."""
    return _fold_v1(name)


@functools.lru_cache(maxsize=16384)
def fold_v2_key(name: str) -> str:
    """fold-v2's key of ``name``."""
    return _fold_v2(name, keep_words_apart=True)


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
_GENERATIONS = {"jr", "sr", "ii", "iii", "iv"}


def fold_v2_identity(name: str) -> tuple[str, str]:
    """fold-v2's key of ``name`` and its core (the key without titles and legal suffixes)."""
    key = fold_v2_key(name)
    markers: set[tuple[str, str]] = set()
    qualified = _QUALIFIER.match(name)
    if qualified:
        name = qualified.group(1)
        markers.add(("qualifier", fold_v2_text(qualified.group(2))))
    words = fold_v2_text(name).split()
    start = _strip_leading(words, markers)
    end = _strip_trailing(words, start, markers)
    if not markers or start >= end:
        return key, key
    core = " ".join(words[start:end])
    if _is_word(core) and not _is_lower_case(name):
        core = core.capitalize()
    return key, core


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
