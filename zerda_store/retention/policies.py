"""Retention policies stored in ``retention_policies``: reading and writing them
(:class:`Policies`), and the cache of the policies in effect, one per store, shared by its
memories, read by the sync calls and awaited by the async ones (the same statements either
way)."""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..db.execution.unit_of_work import Transaction
from ..db.schema import ANY_SCOPE
from ..db.store import StoreCore
from ..errors import RefusedValueError
from .policy import POLICY_CACHE_SECONDS, Policy, Rule, Visibility, policy_from_rows, visibility
from .statements import PolicyStatements


class Policies:
    """Reading and writing the policy table of one store."""

    def __init__(self, store: StoreCore) -> None:
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
            raise RefusedValueError(f"keep_last must be at least 1, got {rule.keep_last}")
        if entity_type != ANY_SCOPE and rule.session_idle is not None:
            raise RefusedValueError(
                "session_idle applies to a whole session, not to one entity type"
            )
        values = {"session_id": scope, "entity_type": entity_type, "updated_at": at}
        values.update(rule.as_dict())

        def work(transaction: Transaction) -> None:
            transaction.count(self._statements.set_rule, values)

        self.store.write(work)
        store_policies(self.store).forget()

    def clear(self, scope: str, entity_type: str | None = None) -> int:
        """Delete the rules of ``scope`` (one entity type's, or all); how many."""
        if entity_type is None:
            statement, values = self._statements.clear_rules, {"session_id": scope}
        else:
            statement = self._statements.clear_rule
            values = {"session_id": scope, "entity_type": entity_type}
        cleared = self.store.write(lambda t: t.count(statement, values))
        store_policies(self.store).forget()
        return cleared

    def last_activity(self, transaction: Transaction, session_id: str) -> float | None:
        """The newest turn's time or newest ``last_seen`` of the session; None if empty."""
        row = transaction.run(self._statements.last_activity, {"session_id": session_id})[0]
        times = [t for t in (row.turn_at, row.entity_at) if t is not None]
        return max(times) if times else None

    def any_rules(self) -> bool:
        """Whether the table holds any rule at all."""
        return bool(self.store.read(lambda t: t.run(self.any_rule))[0].found)

    def visibility_now(self, session_id: str, now: float) -> Visibility | None:
        """What reads of ``session_id`` may show at ``now`` (None: no policy applies), as a
        memory's reads see it, for the operators' listings and exports."""
        policy = self.effective(session_id)
        return None if policy is None else self.visibility(session_id, policy, now)

    def visibility(self, session_id: str, policy: Policy, now: float) -> Visibility:
        """What reads of ``session_id`` may show at ``now`` under ``policy`` (the rule: a
        policy that expires idle sessions reads the session's last activity first)."""
        read = self._last_activity_read(session_id, policy)
        return visibility(policy, now, None if read is None else self.store.read(read))

    async def avisibility(self, session_id: str, policy: Policy, now: float) -> Visibility:
        """:meth:`visibility`, its read awaited."""
        read = self._last_activity_read(session_id, policy)
        return visibility(policy, now, None if read is None else await self.store.aread(read))

    def _last_activity_read(
        self, session_id: str, policy: Policy
    ) -> Callable[[Transaction], float | None] | None:
        """The read the visibility of ``session_id`` needs: its last activity, when
        ``policy`` expires idle sessions; else None (nothing to read)."""
        if policy.general.session_idle is None:
            return None
        return lambda transaction: self.last_activity(transaction, session_id)


class StorePolicies:
    """One store's cache of the policies in effect, read again after ``seconds``: whether
    the table holds any rule at all (with none, the common case, a memory made per request
    costs no query), and each session's policy. A policy set or cleared through this store
    takes effect at once; one set elsewhere within ``seconds``."""

    def __init__(self, policies: Policies, seconds: float = POLICY_CACHE_SECONDS) -> None:
        self._policies = policies
        self._seconds = seconds
        self._lock = threading.Lock()
        self._any = False
        self._any_read_at = -math.inf
        self._by_session: dict[str, tuple[Policy | None, float]] = {}

    def get(self, session_id: str) -> Policy | None:
        now = time.monotonic()
        store = self._policies.store
        if now - self._any_read_at >= self._seconds:
            with self._lock:
                if now - self._any_read_at >= self._seconds:
                    self._found_any(store.read(self._any_work))
        found, policy = self._cached(session_id, now)
        if found:
            return policy
        return self._remember(session_id, store.read(self._policies.rules_work(session_id)))

    async def aget(self, session_id: str) -> Policy | None:
        """:meth:`get`, its reads awaited (two loops' tasks may read the same at once)."""
        now = time.monotonic()
        store = self._policies.store
        if now - self._any_read_at >= self._seconds:
            self._found_any(await store.aread(self._any_work))
        found, policy = self._cached(session_id, now)
        if found:
            return policy
        rows = await store.aread(self._policies.rules_work(session_id))
        return self._remember(session_id, rows)

    def _any_work(self, transaction: Any) -> list[Any]:
        return transaction.run(self._policies.any_rule)  # type: ignore[no-any-return]

    def _found_any(self, rows: list[Any]) -> None:
        self._any, self._any_read_at = bool(rows[0].found), time.monotonic()
        self._by_session.clear()

    def _cached(self, session_id: str, now: float) -> tuple[bool, Policy | None]:
        """Whether the cache answers for ``session_id``, and its answer."""
        if not self._any:
            return True, None
        cached = self._by_session.get(session_id)
        if cached is not None and now - cached[1] < self._seconds:
            return True, cached[0]
        return False, None

    def _remember(self, session_id: str, rows: list[Any]) -> Policy | None:
        policy = policy_from_rows(rows, session_id)
        if policy is not None and not policy.limits_anything:
            policy = None
        self._by_session[session_id] = (policy, time.monotonic())
        return policy

    def forget(self) -> None:
        with self._lock:
            self._any_read_at = -math.inf
            self._by_session.clear()


_STORE_POLICIES: weakref.WeakKeyDictionary[StoreCore, StorePolicies] = weakref.WeakKeyDictionary()
_STORE_POLICIES_LOCK = threading.Lock()


def store_policies(store: StoreCore) -> StorePolicies:
    """The policy cache of ``store``, shared by every memory on it."""
    with _STORE_POLICIES_LOCK:
        cache = _STORE_POLICIES.get(store)
        if cache is None:
            cache = _STORE_POLICIES[store] = StorePolicies(Policies(store))
        return cache


class PolicyCache:
    """A memory's view of its session's policy, through its store's cache."""

    def __init__(self, policies: Policies, session_id: str) -> None:
        self._cache = store_policies(policies.store)
        self._session_id = session_id

    def get(self) -> Policy | None:
        return self._cache.get(self._session_id)

    async def aget(self) -> Policy | None:
        return await self._cache.aget(self._session_id)

    def forget(self) -> None:
        self._cache.forget()
