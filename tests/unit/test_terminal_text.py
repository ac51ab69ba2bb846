"""What the command line escapes before text reaches a terminal: exactly the control
characters (Unicode category Cc) and the bidi embeddings, overrides and isolates, each as
a visible escape; every other character is printed as it is."""

from __future__ import annotations

import unicodedata

from zerda_store.cli.common import escaped

BIDI = {chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


def acts_on_terminal(char: str) -> bool:
    return unicodedata.category(char) == "Cc" or char in BIDI


def test_exactly_controls_and_bidi_overrides_are_escaped_in_all_of_unicode():
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    expected = "".join(
        (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        if acts_on_terminal(c) and c not in "\t\n\r"
        else {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(c, c)
        for c in chars
    )

    assert escaped("".join(chars)) == expected
    assert len([c for c in chars if acts_on_terminal(c)]) == 65 + 9


def test_printable_text_is_left_as_it_is():
    text = "Sarah Chen أحمد 👩🏽‍💻 C:\\temp\\x1b 100% \u200f\u2028"
    assert escaped(text) == text
    assert escaped(12) == "12"
