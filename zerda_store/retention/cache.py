"""The cache of the retention policies in effect: one per store, shared by its memories,
read by the sync calls and awaited by the async ones (the same statements either way)."""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from .policies import POLICY_CACHE_SECONDS, Policies, Policy, policy_from_rows

if TYPE_CHECKING:
    from ..db.engine import Store


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


_STORE_POLICIES: weakref.WeakKeyDictionary[Store, StorePolicies] = weakref.WeakKeyDictionary()
_STORE_POLICIES_LOCK = threading.Lock()


def store_policies(store: Store) -> StorePolicies:
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
