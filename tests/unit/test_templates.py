"""A template filled with one value gives what ``str.format`` gives, errors included."""

from __future__ import annotations

import pytest

from zerda_store.extraction import DEFAULT_EXTRACTION_PROMPT
from zerda_store.memory.base import default_entity_info_template
from zerda_store.model.templates import filler

TEMPLATES = [
    DEFAULT_EXTRACTION_PROMPT,
    default_entity_info_template("en"),
    default_entity_info_template("ar"),
    "{name}",
    "About {name} — {name}",
    "braces {{kept}} {name} {{",
    "no field {{}}",
    "",
    "{name!r}",
    "{name:>12}",
    "{name.upper}",
    "{0}",
    "{text} {name}",
    "{",
    "}",
]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("field", ["name", "text"])
@pytest.mark.parametrize("value", ["Sarah Chen", "", "{x} }{", "أحمد، شركة النور"])
def test_a_filled_template_is_what_format_makes(template: str, field: str, value: str) -> None:
    try:
        expected = template.format(**{field: value})
    except (ValueError, KeyError, IndexError, AttributeError) as exc:
        with pytest.raises(type(exc)):
            filler(template, field)(value)
        return
    assert filler(template, field)(value) == expected
