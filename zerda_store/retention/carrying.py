"""Carrying a session's retention policy with its data (``export``/``import``, ``copy``):
what an export file's header or a copy takes from the source, and how the destination
records it, so that nothing that expired at the source outlives it at the destination.

The carried form is plain values: ``{"session": {type: rule}, "default": {type: rule}}``,
a type ``""`` meaning every type and a rule ``{"keep_last", "max_age", "session_idle"}``.
The destination session's policy after an import or a copy is the one it had at the
source: its own rules if it had any (unless the destination session has rules of its own
already, which are kept), else, where the destination's default differs from the
source's, the source's default recorded as the session's own rules.
"""

from __future__ import annotations

import time
from typing import Any

from ..db.schema import ANY_SCOPE
from ..db.store import StoreCore
from .policies import Policies
from .policy import Rule, make_rule, type_scope

Carried = dict[str, dict[str, dict[str, Any]]]
_PARTS = ("session", "default")


def carried_policy(store: StoreCore, session_id: str) -> Carried:
    """The rules of ``session_id`` and of the default, as an export or a copy carries them
    (an empty part is left out; nothing at all is ``{}``)."""
    policies = Policies(store)
    parts = {
        "session": policies.stored(session_id),
        "default": policies.stored(ANY_SCOPE),
    }
    return {
        part: {kind: rule.as_dict() for kind, rule in sorted(rules.items())}
        for part, rules in parts.items()
        if rules
    }


def checked_carried(value: Any) -> Carried:
    """A carried policy read from a file, checked as ``set_retention`` checks its
    arguments (``ValueError`` or ``TypeError`` naming what is wrong)."""
    if not isinstance(value, dict) or set(value) - set(_PARTS):
        raise ValueError("must be an object with 'session' and 'default' rules")
    checked: Carried = {}
    for part, rules in value.items():
        if not isinstance(rules, dict):
            raise ValueError(f"{part!r} must map entity types to rules")
        checked[part] = {}
        for kind, rule in rules.items():
            scope = ANY_SCOPE if kind == ANY_SCOPE else type_scope(kind)
            if not isinstance(rule, dict) or set(rule) - {"keep_last", "max_age", "session_idle"}:
                raise ValueError(f"the rule of {part!r} for {kind!r} is not a retention rule")
            made = make_rule(rule.get("keep_last"), rule.get("max_age"), rule.get("session_idle"))
            if scope != ANY_SCOPE and made.session_idle is not None:
                raise ValueError("session_idle applies to a whole session, not to one type")
            checked[part][scope] = made.as_dict()
    return checked


def record_carried(store: StoreCore, session_id: str, carried: Carried) -> dict[str, Any]:
    """Give ``session_id`` at ``store`` the policy it had where ``carried`` came from (see
    the module); what was done: ``{"retention": how, "retention_rules": count}``, how being
    ``"none"`` (no policy at the source, or the same default here), ``"session"`` (its own
    rules carried), ``"default"`` (the source's default, recorded as its own rules) or
    ``"kept"`` (the destination session's own rules were kept)."""
    policies = Policies(store)
    own, default = carried.get("session", {}), carried.get("default", {})
    if not (own or default):
        return {"retention": "none", "retention_rules": 0}
    if policies.stored(session_id):
        return {"retention": "kept", "retention_rules": 0}
    if own:
        how, rules = "session", own
    elif _as_rules(default) != policies.stored(ANY_SCOPE):
        how, rules = "default", default
    else:
        return {"retention": "none", "retention_rules": 0}
    at = time.time()
    for kind, rule in rules.items():
        policies.set(session_id, kind, Rule(**rule), at)
    return {"retention": how, "retention_rules": len(rules)}


def carry_default(source: StoreCore, target: StoreCore) -> int:
    """Copy the source's default rules to a destination that has none (a copy of a whole
    database moves its default policy with it); how many rules were copied."""
    rules = Policies(source).stored(ANY_SCOPE)
    destination = Policies(target)
    if not rules or destination.stored(ANY_SCOPE):
        return 0
    at = time.time()
    for kind, rule in rules.items():
        destination.set(ANY_SCOPE, kind, rule, at)
    return len(rules)


def _as_rules(rules: dict[str, dict[str, Any]]) -> dict[str, Rule]:
    return {kind: Rule(**rule) for kind, rule in rules.items()}


def described(receipt: dict[str, Any]) -> str:
    """The retention part of an import's or a copy's receipt, for an operator."""
    how, count = receipt.get("retention", "none"), receipt.get("retention_rules", 0)
    rules = f"{count} rule{'s' if count != 1 else ''}"
    return {
        "none": "no retention policy to carry",
        "session": f"its retention policy carried ({rules})",
        "default": f"the source's default retention policy carried as its own ({rules})",
        "kept": "its own retention policy here kept (the source's not carried)",
    }[how]
