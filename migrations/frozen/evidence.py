"""Which rules a session's keys were written with before revision 0006, from what the
session recorded, never from a guess that merges.

Releases up to 0005 wrote either fold-v1 keys (``normalize_names=True``) or the names as
written (``normalize_names=False``) and recorded neither. What tells them apart without
doubt:

- an entity whose key is not the fold-v1 key of its name: exact (fold-v1 keyed every
  entity with the fold-v1 key of its first name);
- an entity whose key is not its name: fold-v1 (exact keys are the names);
- a turn that lists a name that is no entity's key while its fold-v1 key is one: fold-v1
  (with exact keys that name would be an entity of its own; forgetting an entity takes
  its name out of the turns).

A session where none of these holds (every name lower case, Arabic without hamza forms
or marks, ...) is unsure: it keeps its keys as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .fold_rules import fold_v1

EXACT = "exact"
FOLD_V1 = "fold-v1"
UNSURE = "unsure"


def written_with(entities: Sequence[Any], turn_names: Iterable[Sequence[str]]) -> str:
    """``exact``, ``fold-v1`` or ``unsure`` for a session's ``entities`` (mappings with
    ``name`` and ``name_key``) and the entity names its turns list."""
    if any(row["name_key"] != fold_v1(row["name"]) for row in entities):
        return EXACT
    if any(row["name_key"] != row["name"] for row in entities):
        return FOLD_V1
    keys = {row["name_key"] for row in entities}
    for names in turn_names:
        if any(name not in keys and fold_v1(name) in keys for name in names):
            return FOLD_V1
    return UNSURE
