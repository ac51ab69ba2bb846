"""Retention policies: stored in ``retention_policies``, read back as a :class:`Policy`,
and turned into a :class:`Visibility` (what reads may show at a given moment).

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
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.driver import compile_statement
from ..db.engine import Store
from ..db.schema import ANY_SCOPE, entities, retention_policies, turns
from ..db.unit_of_work import SessionLock, Transaction
from ..turns.queries import param, session_param
from ..turns.statements import _dialect_insert

# How long a memory keeps the policy it read before reading it again (seconds).
POLICY_CACHE_SECONDS = 30.0
NO_CUTOFF = -math.inf


def seconds(duration: timedelta | float | None, what: str) -> float | None:
    """A duration as positive seconds (None stays None)."""
    if duration is None:
        return None
    value = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{what} must be a positive duration, got {duration!r}")
    return value


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
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise ValueError(f"keep_last must be a whole number of at least 1, got {keep_last!r}")
    rule = Rule(keep_last, seconds(max_age, "max_age"), seconds(session_idle, "session_idle"))
    if rule == Rule():
        raise ValueError("a retention rule needs keep_last, max_age or session_idle")
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

    def visible(self, entity_type: str, created_at: float) -> bool:
        return created_at >= self.cutoff_of(entity_type)

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


class PolicyStatements:
    """The policy table's statements, compiled for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        def compiled(statement: Any) -> Any:
            return compile_statement(statement, dialect)

        table = retention_policies
        scope = table.c.session_id == session_param()
        self.rules = compiled(
            sa.select(
                table.c.session_id,
                table.c.entity_type,
                table.c.keep_last,
                table.c.max_age,
                table.c.session_idle,
            ).where(sa.or_(scope, table.c.session_id == param("default_scope", sa.String)))
        )
        insert = _dialect_insert(dialect.name)(table).values(
            session_id=session_param(),
            entity_type=param("entity_type", sa.String),
            keep_last=param("keep_last"),
            max_age=param("max_age", sa.Double),
            session_idle=param("session_idle", sa.Double),
            updated_at=param("updated_at", sa.Double),
        )
        self.set_rule = compiled(
            insert.on_conflict_do_update(
                index_elements=[table.c.session_id, table.c.entity_type],
                set_={
                    column: insert.excluded[column]
                    for column in ("keep_last", "max_age", "session_idle", "updated_at")
                },
            )
        )
        self.any_rule = compiled(sa.select(sa.exists(sa.select(table.c.session_id)).label("found")))
        self.clear_rules = compiled(table.delete().where(scope))
        self.clear_rule = compiled(
            table.delete().where(scope, table.c.entity_type == param("entity_type", sa.String))
        )
        newest_turn = (
            sa.select(turns.c.created_at)
            .where(turns.c.session_id == session_param())
            .order_by(turns.c.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        last_seen = (
            sa.select(sa.func.max(entities.c.last_seen))
            .where(entities.c.session_id == session_param())
            .scalar_subquery()
        )
        self.last_activity = compiled(
            sa.select(newest_turn.label("turn_at"), last_seen.label("entity_at"))
        )


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


class Policies:
    """Reading and writing the policy table of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._statements = store.statements(PolicyStatements)
        self.any_rule = self._statements.any_rule

    def effective(self, session_id: str) -> Policy | None:
        """The policy in effect for ``session_id`` (its own, else the default's)."""
        return policy_from_rows(self.store.read(self.rules_work(session_id)), session_id)

    def rules_work(self, session_id: str) -> Callable[[Transaction], list[Any]]:
        """The rows of :meth:`effective` (the sync and the async policy caches read them)."""
        values = {"session_id": session_id, "default_scope": ANY_SCOPE}
        statement = self._statements.rules
        return lambda t: t.run(statement, values)

    def stored(self, scope: str) -> dict[str, Rule]:
        """The rows of one scope (a session id, or ``''`` for the default), by entity type
        (``''`` for every type)."""
        values = {"session_id": scope, "default_scope": scope}
        rows = self.store.read(lambda t: t.run(self._statements.rules, values))
        return {row.entity_type: Rule(row.keep_last, row.max_age, row.session_idle) for row in rows}

    def set(self, scope: str, entity_type: str, rule: Rule, at: float) -> None:
        """Store (or replace) the rule of ``scope`` for ``entity_type``."""
        if rule.keep_last is not None and rule.keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {rule.keep_last}")
        if entity_type != ANY_SCOPE and rule.session_idle is not None:
            raise ValueError("session_idle applies to a whole session, not to one entity type")
        values = {"session_id": scope, "entity_type": entity_type, "updated_at": at}
        values.update(rule.as_dict())

        def work(transaction: Transaction) -> None:
            transaction.count(self._statements.set_rule, values)

        self.store.write(work)
        _forget_cached(self.store)

    def clear(self, scope: str, entity_type: str | None = None) -> int:
        """Delete the rules of ``scope`` (one entity type's, or all); how many."""
        if entity_type is None:
            statement, values = self._statements.clear_rules, {"session_id": scope}
        else:
            statement = self._statements.clear_rule
            values = {"session_id": scope, "entity_type": entity_type}
        cleared = self.store.write(lambda t: t.count(statement, values))
        _forget_cached(self.store)
        return cleared

    def last_activity(self, transaction: Transaction, session_id: str) -> float | None:
        """The newest turn's time or newest ``last_seen`` of the session; None if empty."""
        row = transaction.run(self._statements.last_activity, {"session_id": session_id})[0]
        times = [t for t in (row.turn_at, row.entity_at) if t is not None]
        return max(times) if times else None

    def visibility(self, session_id: str, policy: Policy, now: float) -> Visibility:
        last = None
        if policy.general.session_idle is not None:
            last = self.store.read(lambda t: self.last_activity(t, session_id))
        return visibility(policy, now, last)


def _forget_cached(store: Store) -> None:
    from .cache import store_policies  # (the cache is built on this module)

    store_policies(store).forget()


def session_lock(session_id: str) -> SessionLock:
    """Pruning excludes the session's saves, one batch at a time."""
    return SessionLock(session_id, exclusive=True)


Clock = Callable[[], float]
