"""Entity-name rules: which extracted names are kept, and the key that identifies an entity.

Pure functions, no I/O. The key is what the database's unique constraint sees; the name
as first seen is kept separately for display.
"""

from __future__ import annotations

import functools
import re
import unicodedata

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


def is_acceptable_name(name: str) -> bool:
    """True when a name can be stored: at most 256 code points, no control characters and
    no lone surrogates (which no database can store as UTF-8)."""
    if not name or len(name) > MAX_NAME_LENGTH:
        return False
    return _UNSTORABLE.search(name) is None


# A CRM's assistant meets the same few thousand names again and again.
@functools.lru_cache(maxsize=8192)
def name_key(name: str, *, normalize: bool = True) -> str:
    """The identity of an entity name.

    With ``normalize`` the key is NFKC, casefolded, with whitespace collapsed; Arabic
    diacritics and tatweel are dropped and the alef forms folded into one, so "Sarah",
    "sarah " and "SARAH" (or "أحمد" and "احمد") are one entity. Without it the name is
    its own key, as in the original in-memory class.
    """
    if not normalize:
        return name
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _ARABIC_MARKS.sub("", text).translate(_ALEF_FORMS)
    return " ".join(text.split())
