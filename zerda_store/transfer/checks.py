"""The checks of one export record against the rules the API enforces: types, ranges,
storable text, keys recomputed from names, references and order. Pure functions over
plain values; :mod:`transfer` runs them over a file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..db.schema import contexts, entities, extractions, identity_judgements, max_length, turns
from ..identity.rules import identify
from ..model.names import (
    EXACT,
    FOLD_V1,
    FOLD_V2,
    FOLD_V2_CASELESS,
    KeyRules,
    is_acceptable_name,
    is_held_apart,
)
from ..validation import MAX_TEXT_LENGTH

MAX_TIMESTAMP = 253_402_300_799.0
_BIGINT = 2**63 - 1
_INTEGER = 2**31 - 1

_NUMBER = (int, float)
_OPTIONAL_STR = (str, type(None))
_OPTIONAL_INT = (int, type(None))
_OPTIONAL_NUMBER = (int, float, type(None))

_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "turn": {
        "id": (int,),
        "input_text": (str,),
        "output_text": (str,),
        "entity_names": (list,),
        "created_at": _NUMBER,
        "idempotency_key": _OPTIONAL_STR,
        "extractor": _OPTIONAL_STR,
        "status": _OPTIONAL_STR,
        "error": _OPTIONAL_STR,
        "latency_ms": _OPTIONAL_NUMBER,
        "entity_count": _OPTIONAL_INT,
        "attempts": _OPTIONAL_INT,
        "updated_at": _OPTIONAL_NUMBER,
    },
    "entity": {
        "id": (int,),
        "name_key": (str,),
        "name": (str,),
        "entity_type": (str,),
        "first_seen": _NUMBER,
        "last_seen": _NUMBER,
        "first_turn_id": (int,),
        "first_position": (int,),
    },
    "context": {
        "id": (int,),
        "entity_id": (int,),
        "turn_id": _OPTIONAL_INT,
        "turn_seq": (int,),
        "text": (str,),
    },
    "alias": {
        "entity_id": (int,),
        "alias": (str,),
        "source": (str,),
        "created_at": _NUMBER,
    },
    # A person's judgement of two entities (``confirm_same``, ``reject_same``): their
    # keys in sorted order and their names as judged.
    "judgement": {
        "key_a": (str,),
        "key_b": (str,),
        "name_a": (str,),
        "name_b": (str,),
        "verdict": (str,),
        "decided_by": (str,),
        "decided_at": _NUMBER,
    },
}
KINDS = tuple(_FIELDS)
ALIAS_SOURCES = {"manual", "merge", "mention"}
VERDICTS = {"same", "different"}
# The key rules a file's keys may have been made with; a header that names its rules (format
# 3) allows only those. Files of formats 1 and 2 predate fold-v2: their keys are fold-v1's.
CURRENT_RULES = (FOLD_V2, FOLD_V2_CASELESS, EXACT)
LEGACY_RULES = (FOLD_V1, EXACT)

# The smallest and largest value of each whole-number field (the columns' types).
_INT_RANGES = {
    "id": (1, _BIGINT),
    "entity_id": (1, _BIGINT),
    "turn_id": (1, _BIGINT),
    "turn_seq": (0, _BIGINT),
    "first_turn_id": (0, _BIGINT),
    "first_position": (0, _INTEGER),
    "entity_count": (0, _INTEGER),
    "attempts": (0, _INTEGER),
}
_TIMES = {"created_at", "updated_at", "first_seen", "last_seen", "decided_at"}
# Longest text the tables take in these fields (the others are unbounded), from the schema.
_MAX_LENGTHS = {
    "name": max_length(entities.c.name),
    "entity_type": max_length(entities.c.entity_type),
    "idempotency_key": max_length(turns.c.idempotency_key),
    "extractor": max_length(extractions.c.extractor),
    "name_a": max_length(identity_judgements.c.name_a),
    "name_b": max_length(identity_judgements.c.name_b),
    "decided_by": max_length(identity_judgements.c.decided_by),
    "input_text": MAX_TEXT_LENGTH,
    "output_text": MAX_TEXT_LENGTH,
    "text": MAX_TEXT_LENGTH,
}
_STATUSES = {None, "ok", "failed", "skipped"}
assert contexts.c.text.type.python_type is str


def plural_counts(counts: dict[str, int]) -> dict[str, int]:
    """Counts by kind as the end line names them (aliases only if there are any)."""
    plural = {"turns": counts["turn"], "entities": counts["entity"], "contexts": counts["context"]}
    if counts.get("alias"):
        plural["aliases"] = counts["alias"]
    if counts.get("judgement"):
        plural["judgements"] = counts["judgement"]
    return plural


class ImportFormatError(ValueError):
    """A file that is not a valid export; the message names the line."""


@dataclass
class CheckedFile:
    """What the first pass over a file learnt: its session, its counts, the key mode of
    its entities, and whether it ended with a matching end line."""

    session_id: str = ""
    version: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    # The rules the file's keys agree with so far (all of them, to begin with).
    key_rules: tuple[KeyRules, ...] = CURRENT_RULES
    # The retention policy the header carries (retention.carrying), {} for none.
    retention: dict[str, Any] = field(default_factory=dict)
    _turn_ids: set[int] = field(default_factory=set)
    _last_turn_id: int = 0
    _entity_ids: set[int] = field(default_factory=set)
    _unique: set[tuple[str, str, Any]] = field(default_factory=set)
    _snippets: set[tuple[int, int]] = field(default_factory=set)
    # Entity names by id, then (at the first alias) entity ids by key, and alias keys.
    _entity_names: dict[int, str] = field(default_factory=dict)
    _entity_keys: dict[str, int] | None = None
    _alias_keys: dict[str, int] = field(default_factory=dict)
    _held_apart: set[int] = field(default_factory=set)


def problem(number: int, field_name: str, what: str) -> ImportFormatError:
    return ImportFormatError(f"line {number}: field {field_name!r} {what}")


def _check_value(kind: str, field_name: str, value: Any, number: int) -> None:
    types = _FIELDS[kind][field_name]
    if not isinstance(value, types) or isinstance(value, bool):
        raise problem(number, field_name, "is missing or of the wrong type")
    if isinstance(value, str):
        _check_text(value, field_name, number)
    elif isinstance(value, int) and field_name in _INT_RANGES:
        low, high = _INT_RANGES[field_name]
        if not low <= value <= high:
            raise problem(number, field_name, f"is out of range ({low} to {high})")
    elif isinstance(value, (int, float)):
        top = MAX_TIMESTAMP if field_name in _TIMES else 1e12
        # Compared, never converted: an int of 400 digits has no float (and NaN fails).
        if not 0 <= value <= top:
            raise problem(number, field_name, f"is out of range (0 to {top:g})")


def _check_text(value: str, field_name: str, number: int) -> None:
    if "\x00" in value:
        raise problem(number, field_name, "holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise problem(number, field_name, "is not valid Unicode (a lone surrogate)") from None
    limit = _MAX_LENGTHS.get(field_name)
    if limit is not None and len(value) > limit:
        raise problem(number, field_name, f"is over {limit} characters")


def check_record(record: Any, number: int, checked: CheckedFile) -> None:
    if not isinstance(record, dict) or record.get("kind") not in _FIELDS:
        raise ImportFormatError(
            f"line {number}: expected a turn, entity, context, alias or judgement record"
        )
    kind = record["kind"]
    for field_name in _FIELDS[kind]:
        _check_value(kind, field_name, record.get(field_name), number)
    {
        "turn": _check_turn,
        "entity": _check_entity,
        "context": _check_context,
        "alias": _check_alias,
        "judgement": _check_judgement,
    }[kind](record, number, checked)
    checked.counts[kind] += 1


def _claim(checked: CheckedFile, kind: str, field_name: str, value: Any, number: int) -> None:
    if (kind, field_name, value) in checked._unique:
        raise ImportFormatError(f"line {number}: a second {kind} with this {field_name}")
    checked._unique.add((kind, field_name, value))


def _check_turn(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    if not all(isinstance(n, str) and is_acceptable_name(n) for n in record["entity_names"]):
        raise problem(number, "entity_names", "must be a list of storable names")
    if record["status"] not in _STATUSES:
        raise problem(number, "status", "is not an extraction status")
    if checked.counts["entity"] or checked.counts["context"]:
        raise ImportFormatError(f"line {number}: turns must come before entities and snippets")
    _claim(checked, "turn", "id", record["id"], number)
    if record["id"] < checked._last_turn_id:
        # The import keeps the file's order (new ids in file order), and recall follows it:
        # turns moved up in an edited file would be recalled as the newest.
        raise problem(number, "id", "is out of order: turns come in the order they were saved")
    checked._last_turn_id = record["id"]
    if record["idempotency_key"] is not None:
        _claim(checked, "turn", "idempotency_key", record["idempotency_key"], number)
    checked._turn_ids.add(record["id"])


def _check_entity(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    name = record["name"]
    if not is_acceptable_name(name):
        raise problem(number, "name", "is not a storable name")
    if record["entity_type"] != "unknown" and not is_acceptable_name(record["entity_type"]):
        raise problem(number, "entity_type", "is not a storable type")
    if record["first_seen"] > record["last_seen"]:
        raise problem(number, "last_seen", "is before first_seen")
    if checked.counts["context"]:
        raise ImportFormatError(f"line {number}: entities must come before snippets")
    _check_key(record, number, checked)
    if checked.version >= 3:
        _check_core(record, number, checked)
    _claim(checked, "entity", "id", record["id"], number)
    _claim(checked, "entity", "name_key", record["name_key"], number)
    checked._entity_ids.add(record["id"])
    checked._entity_names[record["id"]] = name
    if is_held_apart(record["name_key"]):
        checked._held_apart.add(record["id"])


def _check_core(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    """A format 3 entity carries its core key (the key without titles and legal forms,
    which titled mentions find it by): it must be the one its name gives, or, for an entity
    held apart by an unmerge, its key held apart."""
    core = record.get("core_key")
    if not isinstance(core, str):
        raise problem(number, "core_key", "is missing or of the wrong type")
    if is_held_apart(record["name_key"]) and core == record["name_key"]:
        return
    cores = {identify(record["name"], rules).core for rules in checked.key_rules}
    if core not in cores:
        expected = identify(record["name"], checked.key_rules[0]).core
        raise problem(number, "core_key", f"does not match the name (expected {expected!r})")


def _check_key(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    """The key must be the one the API computes from the name, under one set of key rules
    for the whole file (the header's, or, in an older file, fold-v1's or the exact names)."""
    name, key = record["name"], record["name_key"]
    if is_held_apart(key):
        return  # brought back by an unmerge under a key no rule makes: kept as it is
    if not key:
        raise problem(number, "name_key", "is empty: the name has no letters or digits")
    agreeing = tuple(rules for rules in checked.key_rules if rules.key(name) == key)
    if not agreeing:
        expected = checked.key_rules[0].key(name)
        if all(rules.key(name) != key for rules in (*CURRENT_RULES, *LEGACY_RULES)):
            raise problem(number, "name_key", f"does not match the name (expected {expected!r})")
        raise problem(number, "name_key", "is keyed differently from the file's other entities")
    checked.key_rules = agreeing


def file_key_rules(checked: CheckedFile) -> KeyRules:
    """The rules an import keys the file's entities with: the file's own, or, for a file
    keyed by fold-v1 (before fold-v2), fold-v2 (the entities are re-keyed)."""
    rules = checked.key_rules[0]
    return FOLD_V2 if rules is FOLD_V1 else rules


def _check_context(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    if record["entity_id"] not in checked._entity_ids:
        raise ImportFormatError(f"line {number}: snippet of an entity not in the file")
    turn_id = record["turn_id"]
    if turn_id is not None:
        if turn_id not in checked._turn_ids:
            raise ImportFormatError(f"line {number}: snippet of a turn not in the file")
        pair = (record["entity_id"], turn_id)
        if pair in checked._snippets:
            raise ImportFormatError(f"line {number}: a second snippet of this entity and turn")
        checked._snippets.add(pair)
    _claim(checked, "context", "id", record["id"], number)


def _check_alias(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    if record["entity_id"] not in checked._entity_ids:
        raise ImportFormatError(f"line {number}: alias of an entity not in the file")
    if not is_acceptable_name(record["alias"]):
        raise problem(number, "alias", "is not a storable name")
    if record["source"] not in ALIAS_SOURCES:
        raise problem(number, "source", f"is not one of {sorted(ALIAS_SOURCES)}")
    _check_alias_identity(record, number, checked)


def _check_alias_identity(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    """The rules of ``add_alias``, under the rules the import keys with: an alias names
    something, is not an entity's name, and belongs to one entity."""
    rules = file_key_rules(checked)
    if checked._entity_keys is None:
        names = checked._entity_names
        # An entity held apart is found by no name (an unmerge kept it apart from the
        # entity, or the alias, its name's key names), so an alias may have its name's key.
        checked._entity_keys = {
            rules.key(name): id_ for id_, name in names.items() if id_ not in checked._held_apart
        }
    key, owner = rules.key(record["alias"]), record["entity_id"]
    if not key:
        raise problem(number, "alias", "has no letters or digits to name an entity by")
    named = checked._entity_keys.get(key)
    if named == owner:
        raise problem(number, "alias", "is the entity's own name")
    if named is not None:
        raise problem(number, "alias", "is the name of another entity (merge them instead)")
    held = checked._alias_keys.get(key)
    if held == owner:
        raise problem(number, "alias", "is a second alias of its entity with the same key")
    if held is not None:
        raise problem(number, "alias", "is an alias of another entity already")
    checked._alias_keys[key] = owner


def _check_judgement(record: dict[str, Any], number: int, checked: CheckedFile) -> None:
    """A judgement names two different entities by keys the file's key rules make from
    its names (or keys held apart), in sorted order, once per pair; says "same" or
    "different"; and who decided."""
    if record["verdict"] not in VERDICTS:
        raise problem(number, "verdict", f"is not one of {sorted(VERDICTS)}")
    if not is_acceptable_name(record["decided_by"]):
        raise problem(number, "decided_by", "is not 1 to 255 characters without control characters")
    for side in ("a", "b"):
        name, key = record[f"name_{side}"], record[f"key_{side}"]
        if not is_acceptable_name(name):
            raise problem(number, f"name_{side}", "is not a storable name")
        if not is_held_apart(key) and all(rules.key(name) != key for rules in checked.key_rules):
            raise problem(number, f"key_{side}", "does not match its name under the file's rules")
    if not record["key_a"] < record["key_b"]:
        raise problem(number, "key_b", "must sort after key_a (two entities, in sorted order)")
    _claim(checked, "judgement", "pair", (record["key_a"], record["key_b"]), number)
