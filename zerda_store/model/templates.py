"""Templates filled with one value: the LLM's prompt (``{text}``) and the memory string's
heading of an entity (``{name}``), on every turn."""

from __future__ import annotations

import functools
import string
from collections.abc import Callable


@functools.lru_cache(maxsize=64)
def filler(template: str, field: str = "text") -> Callable[[str], str]:
    """``template.format(**{field: …})``, made once per template: where every field is a
    plain ``{field}`` (the default prompt has two ``{text}``), the template's literal parts
    joined by the value, without parsing the template again on each call."""
    parts: list[str] = []
    current = ""
    try:
        for literal, name, spec, conversion in string.Formatter().parse(template):
            current += literal  # an escaped brace ends a literal part with no field
            if name is None:
                continue
            if name != field or spec or conversion:
                return lambda value: template.format(**{field: value})
            parts.append(current)
            current = ""
    except ValueError:  # not a valid template: format says so on each call
        return lambda value: template.format(**{field: value})
    parts.append(current)
    return lambda value: value.join(parts)
