"""Entity-name rules: which extracted names are kept, and the key that identifies an entity.

Pure functions, no I/O (but for reading the packaged lexicon once, on first need). The key
is what the database's unique constraint sees; the name as first seen is kept for display.

Key rules are named and frozen: a session records the rules its keys were made with
(``session_key_rules``), and changing what a rule set does means a new name and a data
migration that re-keys the sessions, never an edit here.
"""

from __future__ import annotations

import functools
import gzip
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

MAX_NAME_LENGTH = 256
# Entity types ("PERSON", "ORG", ...) are short labels; longer ones are cut to this.
MAX_TYPE_LENGTH = 64
# The type of an entity whose kind no extractor has told.
UNKNOWN_TYPE = "unknown"

# Control characters (Unicode category Cc) and lone surrogates (Cs).
_UNSTORABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
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


def word_case(key: str, name: str, rules: KeyRules) -> str:
    """``key`` (folded text taken from ``name``) with the rules' word rule applied."""
    if rules is FOLD_V2 and _is_word(key) and not _is_lower_case(name):
        return key.capitalize()
    return key


def _is_word(key: str) -> bool:
    return key.isascii() and key.isalpha() and key in _lowercase_words()


def _is_lower_case(name: str) -> bool:
    return not any(ch.isupper() for ch in name)


@dataclass(frozen=True)
class KeyRules:
    """A named, frozen way of turning an entity name into its key."""

    name: str
    description: str
    _key: Callable[[str], str]

    def key(self, name: str) -> str:
        return _cached_key(self.name, name)


EXACT = KeyRules("exact", "the name as written (the original class)", lambda name: name)
FOLD_V1 = KeyRules(
    "fold-v1", "NFKC, casefold, collapsed whitespace, Arabic marks and alef forms", _fold_v1
)
FOLD_V2 = KeyRules(
    "fold-v2",
    "fold-v1, plus invisible characters, digits, Latin accents, Arabic letter variants and "
    "punctuation; an ordinary English word in lower case stays apart from its capitalised form",
    functools.partial(_fold_v2, keep_words_apart=True),
)
FOLD_V2_CASELESS = KeyRules(
    "fold-v2-caseless",
    "fold-v2, with every word merging with its capitalised form",
    functools.partial(_fold_v2, keep_words_apart=False),
)
KEY_RULES = {rules.name: rules for rules in (EXACT, FOLD_V1, FOLD_V2, FOLD_V2_CASELESS)}
# What new sessions are keyed with.
DEFAULT_KEY_RULES = FOLD_V2


def key_rules_for(*, normalize_names: bool, merge_lowercase_words: bool = False) -> KeyRules:
    """The rules a memory's options ask for."""
    if not normalize_names:
        return EXACT
    return FOLD_V2_CASELESS if merge_lowercase_words else FOLD_V2


# A CRM's assistant meets the same few thousand names again and again.
@functools.lru_cache(maxsize=16384)
def _cached_key(rules: str, name: str) -> str:
    return KEY_RULES[rules]._key(name)


# The key of an entity that an unmerge brought back while its old key was another entity's
# (new key rules made the two keys one): a key no rule makes (names hold no control
# characters), unique by the entity's id, so that mentions of either name go to the entity
# holding the rules' key and the one brought back keeps its own snippets.
HELD_APART = "\x02apart "


def held_apart_key(entity_id: int) -> str:
    """The key of an entity held apart from the one its name's key names."""
    return f"{HELD_APART}{entity_id}"


def is_held_apart(key: str) -> bool:
    """Whether ``key`` is an entity's held apart (:func:`held_apart_key`)."""
    return key.startswith(HELD_APART)


# Characters that change no letter a reader sees, which an extracted name may carry (an
# emoji presentation selector after a name, a name pasted from a spoof): variation selectors
# (U+FE00–FE0F, U+E0100–E01EF, the Mongolian ones), tag characters (U+E0000–E007F), the
# Hangul fillers (U+115F, U+1160, U+3164, U+FFA0), the combining grapheme joiner and the
# Khmer inherent vowels. Dropped from a name as it is extracted, before it is keyed: the
# key rules stay as they are (frozen), and a name carrying them names the entity without.
_IGNORABLE = re.compile(
    "[\ufe00-\ufe0f\U000e0000-\U000e007f\U000e0100-\U000e01ef\u180b-\u180d\u180f"
    "\u115f\u1160\u3164\uffa0\u034f\u17b4\u17b5]"
)


def without_ignorables(name: str) -> str:
    """``name`` without the characters that change no letter (see ``_IGNORABLE``), its
    ends stripped."""
    return _IGNORABLE.sub("", name).strip()


def without_ignorable_characters(name: str) -> str:
    """``name`` without the characters that change no letter, its ends as given: a name a
    caller looks up ("Sarah " is not "Sarah" under the original's exact keys)."""
    return _IGNORABLE.sub("", name)


# :func:`without_ignorables` remembered: what extraction finds and callers look up are the
# same few thousand names again and again. For short text only (a name, an LLM's usual
# answer): a longer one is cleaned each time, never kept.
cached_without_ignorables = functools.lru_cache(maxsize=16384)(without_ignorables)


def is_acceptable_name(name: str, limit: int = MAX_NAME_LENGTH) -> bool:
    """True when a name can be stored: 1 to ``limit`` code points (256: a name's column),
    no control characters and no lone surrogates (which no database can store as UTF-8)."""
    if not name or len(name) > limit:
        return False
    return _UNSTORABLE.search(name) is None


def name_key(name: str, *, normalize: bool = True) -> str:
    """The key of ``name`` under the default rules (``normalize``), or the name itself."""
    return (DEFAULT_KEY_RULES if normalize else EXACT).key(name)
