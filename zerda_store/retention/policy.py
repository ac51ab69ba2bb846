"""Retention policies as values: a :class:`Rule` per scope and entity type, the
:class:`Policy` they make for a session, and the :class:`Visibility` it gives reads at a
given moment (pure: no I/O; :mod:`policies` reads and writes them).

A session's policy is its own rows if it has any, else the default rows (scope ``''``).
Within those, a rule for one entity type overrides the rule for every type, field by
field (a field left None there takes the every-type rule's). Turns age by the every-type
rule's ``max_age``; ``session_idle`` is a rule for every type only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import sqlalchemy as sa

from ..db.execution.statements import param
from ..db.execution.unit_of_work import SessionLock
from ..db.schema import ANY_SCOPE
from ..errors import RefusedValueError
from ..validation import MAX_COUNT, checked_entity_type, checked_seconds, checked_whole_number

# How long a memory keeps the policy it read before reading it again (seconds).
POLICY_CACHE_SECONDS = 30.0
NO_CUTOFF = -math.inf

T = TypeVar("T")


def seconds(duration: timedelta | float | None, what: str) -> float | None:
    """A duration as positive seconds (None stays None)."""
    return None if duration is None else checked_seconds(duration, what)


def type_scope(entity_type: str | None) -> str:
    """The entity-type scope of a rule: ``''`` (every type) for None, else the type,
    checked as the schema stores types (an empty type is refused, not read as every type)."""
    return ANY_SCOPE if entity_type is None else checked_entity_type(entity_type)


@dataclass(frozen=True)
class Rule:
    """One row of the policy table: limits for one scope and entity type (None: none)."""

    keep_last: int | None = None
    max_age: float | None = None
    session_idle: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "keep_last": self.keep_last,
            "max_age": self.max_age,
            "session_idle": self.session_idle,
        }


def make_rule(
    keep_last: int | None = None,
    max_age: timedelta | float | None = None,
    session_idle: timedelta | float | None = None,
) -> Rule:
    """A rule from the API's arguments (durations as timedelta or seconds), checked."""
    if keep_last is not None:
        checked_whole_number(keep_last, "keep_last", 1, MAX_COUNT)
    rule = Rule(keep_last, seconds(max_age, "max_age"), seconds(session_idle, "session_idle"))
    if rule == Rule():
        raise RefusedValueError("a retention rule needs keep_last, max_age or session_idle")
    return rule


def describe(policy: Policy | None, session_id: str) -> dict[str, Any]:
    """A policy as plain values: where it comes from, its rule for every type, and its
    rules by entity type (durations in seconds)."""
    if policy is None:
        return {"source": None, **Rule().as_dict(), "by_type": {}}
    return {
        "source": "default" if policy.scope == ANY_SCOPE else "session",
        **policy.general.as_dict(),
        "by_type": {t: rule.as_dict() for t, rule in sorted(policy.by_type.items())},
    }


@dataclass(frozen=True)
class Policy:
    """The rules in effect for one session: ``scope`` is the session id, or ``''`` when
    the default applies."""

    scope: str
    general: Rule = Rule()
    by_type: Mapping[str, Rule] = field(default_factory=dict)

    def keep_last(self, entity_type: str) -> int | None:
        rule = self.by_type.get(entity_type)
        if rule is not None and rule.keep_last is not None:
            return rule.keep_last
        return self.general.keep_last

    def max_age(self, entity_type: str) -> float | None:
        rule = self.by_type.get(entity_type)
        if rule is not None and rule.max_age is not None:
            return rule.max_age
        return self.general.max_age

    @property
    def limits_snippets(self) -> bool:
        rules = [self.general, *self.by_type.values()]
        return any(r.keep_last is not None or r.max_age is not None for r in rules)

    @property
    def limits_anything(self) -> bool:
        return self.limits_snippets or self.general.session_idle is not None


@dataclass(frozen=True)
class Visibility:
    """What reads may show at one moment: snippets created at or after their cutoff (by
    entity type), at most ``keep_last`` per entity, turns created at or after
    ``turn_cutoff``. A session idle past its limit has every cutoff at that moment's
    idle cutoff, so that all it held is hidden."""

    cutoff: float
    type_cutoffs: tuple[tuple[str, float], ...]
    turn_cutoff: float
    policy: Policy
    idle_expired: bool = False

    def cutoff_of(self, entity_type: str) -> float:
        return dict(self.type_cutoffs).get(entity_type, self.cutoff)

    def keep_last(self, entity_type: str) -> int | None:
        return self.policy.keep_last(entity_type)

    def newest(self, items: list[T], entity_type: str) -> list[T]:
        """The last of ``items`` (an entity's, oldest first) that the entity type's
        ``keep_last`` keeps: all of them without one."""
        keep = self.keep_last(entity_type)
        return items if keep is None or len(items) <= keep else items[len(items) - keep :]

    def visible(self, entity_type: str, created_at: float) -> bool:
        return created_at >= self.cutoff_of(entity_type)

    def shows_turn(self, created_at: float) -> bool:
        return created_at >= self.turn_cutoff

    def cutoff_values(self) -> dict[str, Any]:
        """The values of :func:`cutoff_case` with ``len(type_cutoffs)`` types."""
        values: dict[str, Any] = {"cutoff": self.cutoff}
        for i, (entity_type, cutoff) in enumerate(self.type_cutoffs):
            values[f"type_{i}"] = entity_type
            values[f"cutoff_{i}"] = cutoff
        return values


def visibility(policy: Policy, now: float, last_activity: float | None) -> Visibility:
    """The visibility of a session under ``policy`` at ``now``, given the time of its last
    activity (needed only with ``session_idle``)."""
    idle = policy.general.session_idle
    if idle is not None and last_activity is not None and now - last_activity > idle:
        everything = now - idle
        types = tuple((t, everything) for t in sorted(policy.by_type))
        return Visibility(everything, types, everything, policy, idle_expired=True)

    def cutoff(age: float | None) -> float:
        return NO_CUTOFF if age is None else now - age

    types = tuple((t, cutoff(policy.max_age(t))) for t in sorted(policy.by_type))
    general = policy.general.max_age
    return Visibility(cutoff(general), types, cutoff(general), policy)


def cutoff_case(entity_type: Any, count: int) -> Any:
    """The snippet cutoff of an entity of type ``entity_type``, for ``count`` types with
    their own (parameters ``type_i``/``cutoff_i``, else ``cutoff``)."""
    default = param("cutoff", sa.Double)
    if count == 0:
        return default
    whens = [
        (entity_type == param(f"type_{i}", sa.String), param(f"cutoff_{i}", sa.Double))
        for i in range(count)
    ]
    return sa.case(*whens, else_=default)


def policy_from_rows(rows: list[Any], session_id: str) -> Policy | None:
    """The session's own rules if it has any, else the default's; None without either."""
    own = [row for row in rows if row.session_id == session_id]
    chosen = own or [row for row in rows if row.session_id == ANY_SCOPE]
    if not chosen:
        return None
    general = Rule()
    by_type: dict[str, Rule] = {}
    for row in chosen:
        rule = Rule(row.keep_last, row.max_age, row.session_idle)
        if row.entity_type == ANY_SCOPE:
            general = rule
        else:
            by_type[row.entity_type] = rule
    return Policy(chosen[0].session_id, general, by_type)


def session_lock(session_id: str) -> SessionLock:
    """Pruning excludes the session's saves, one batch at a time."""
    return SessionLock(session_id, exclusive=True)


Clock = Callable[[], float]
