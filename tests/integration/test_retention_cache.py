"""The store caches which retention policies are in effect: a memory made per request
reads nothing about policies while the cache is fresh, and a policy set through any
memory on the store applies at once."""

from __future__ import annotations

from tests.doubles import FixedLLM, driver_calls
from zerda_store import ConversationEntityMemory, Store


def _one_request(store: Store, session_id: str) -> ConversationEntityMemory:
    memory = ConversationEntityMemory(FixedLLM("Sarah"), store=store, session_id=session_id)
    memory.save_context({"input": "Sarah called"}, {"output": "ok"})
    memory.load_memory_variables({"input": "Sarah?"})
    return memory


def test_memories_per_request_read_no_policy_while_the_cache_is_fresh(database_url):
    with Store(database_url) as store:
        _one_request(store, "warm-up")
        with driver_calls(store.engine) as sent:
            for number in range(5):
                _one_request(store, f"customer-{number}")
        assert sent
        assert not [sql for sql, _ in sent if "retention_policies" in sql]


def test_a_policy_set_through_one_memory_applies_to_the_others_at_once(database_url):
    with Store(database_url) as store:
        first = _one_request(store, "customer")
        for _ in range(3):
            first.save_context({"input": "Sarah again"}, {"output": "ok"})
        second = ConversationEntityMemory(FixedLLM("Sarah"), store=store, session_id="customer")
        assert second.get_entity_info("Sarah")["contexts_count"] == 4

        first.set_retention(keep_last=2)

        assert second.get_entity_info("Sarah")["contexts_count"] == 2
        first.clear_retention()
        assert second.get_entity_info("Sarah")["contexts_count"] == 4
