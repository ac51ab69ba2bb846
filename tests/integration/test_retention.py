"""Retention policies on both backends: each policy hides what it expires at once and
``prune`` deletes it, in batches, resumably, with a dry run that counts the same."""

from __future__ import annotations

import math
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doubles import Clock, TypedNames
from zerda_store import Store
from zerda_store.admin import AdminRepository
from zerda_store.db.store import core_of
from zerda_store.retention.pruning import Pruner
from zerda_store.retention.sweeper import start_sweeper

DAY = 86_400.0


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def memory(make_memory, clock):
    return make_memory(extractor=TypedNames(), session_id="s1", clock=clock)


def save(memory, names: str, text: str) -> None:
    memory.save_context({"input": f"{names} | {text}"}, {"output": "ok"})


def stored(database_url: str, table: str, session_id: str = "s1") -> int:
    with Store(database_url) as store, core_of(store).query() as connection:
        query = f"SELECT COUNT(*) FROM {table} WHERE session_id = :s"
        return int(connection.execute(sa.text(query), {"s": session_id}).scalar_one())


def pruner(database_url: str, clock: Clock, **options: Any) -> tuple[Store, Pruner]:
    store = Store(database_url)
    return store, Pruner(core_of(store), now=clock, **options)


def test_keep_last_hides_older_snippets_before_the_prune_and_deletes_them_after(
    memory, database_url
):
    for n in range(5):
        save(memory, "Sarah/PERSON", f"note {n}")
    memory.set_retention(keep_last=2)

    assert memory.entity_store["Sarah"].contexts == [
        "Sarah/PERSON | note 3 ok",
        "Sarah/PERSON | note 4 ok",
    ]
    assert memory.get_entity_info("Sarah")["contexts_count"] == 2
    assert memory.get_memory_stats()["total_contexts"] == 2
    assert memory.prune() == {"sessions": 0, "turns": 0, "snippets": 3, "entities": 0}
    assert stored(database_url, "contexts") == 2
    assert len(memory.chat_memory) == 5  # keep_last trims snippets, never turns
    assert "note 4" in memory.load_memory_variables({"input": "Sarah/PERSON | ?"})["entity_info"]


def test_max_age_hides_old_snippets_turns_and_entities_before_the_sweep(memory, clock):
    save(memory, "Old Co/ORG", "ancient")
    clock.now += 10 * DAY
    save(memory, "Sarah/PERSON", "recent")
    memory.set_retention(max_age=timedelta(days=5))

    assert memory.list_entities() == ["Sarah"]
    assert len(memory.entity_store) == 1
    assert memory.get_entity_info("Old Co") is None
    assert "Old Co" not in memory.entity_store
    assert [turn["input"] for turn in memory.chat_memory] == ["Sarah/PERSON | recent"]
    assert memory.chat_memory[0]["input"] == "Sarah/PERSON | recent"
    assert memory.chat_memory[-1]["input"] == "Sarah/PERSON | recent"
    assert memory.load_memory_variables({"input": "Old Co/ORG | ?"})["entity_info"] == ""
    stats = memory.get_memory_stats()
    assert (stats["entity_count"], stats["message_count"], stats["total_contexts"]) == (1, 1, 1)

    assert memory.prune() == {"sessions": 0, "turns": 1, "snippets": 1, "entities": 1}
    assert memory.list_entities() == ["Sarah"]


def test_a_note_ages_from_when_it_was_added(memory, clock, database_url):
    save(memory, "Sarah/PERSON", "turn")
    clock.now += 3 * DAY
    memory.entity_store["Sarah"].add_context("a note")
    clock.now += 3 * DAY
    memory.set_retention(max_age=timedelta(days=4))

    assert memory.entity_store["Sarah"].get_recent_contexts(None) == ["a note"]
    assert memory.prune()["snippets"] == 1
    assert memory.entity_store["Sarah"].contexts == ["a note"]


def test_a_rule_for_one_entity_type_overrides_the_rule_for_every_type(memory):
    for n in range(4):
        save(memory, "Sarah/PERSON, Acme/ORG", f"n{n}")
    memory.set_retention(keep_last=3)
    memory.set_retention(keep_last=1, entity_type="ORG")

    assert len(memory.entity_store["Acme"].contexts) == 1
    assert len(memory.entity_store["Sarah"].contexts) == 3
    assert memory.get_retention()["by_type"]["ORG"]["keep_last"] == 1
    assert memory.prune()["snippets"] == 1 + 3


def test_an_idle_session_expires_whole_and_a_new_save_starts_afresh(memory, clock, database_url):
    save(memory, "Sarah/PERSON", "first")
    memory.set_retention(session_idle=timedelta(days=30))
    clock.now += 31 * DAY

    assert memory.list_entities() == []
    assert len(memory.chat_memory) == 0
    assert memory.get_memory_stats()["entity_count"] == 0
    assert memory.prune(dry_run=True) == {"sessions": 1, "turns": 1, "snippets": 1, "entities": 1}

    save(memory, "Tom/PERSON", "after the gap")  # the save expires the old data first

    assert memory.list_entities() == ["Tom"]
    assert stored(database_url, "turns") == 1
    assert memory.prune() == {"sessions": 0, "turns": 0, "snippets": 0, "entities": 0}


@pytest.mark.fans_out
def test_the_default_policy_applies_to_sessions_without_their_own(make_memory, clock, database_url):
    first = make_memory(extractor=TypedNames(), session_id="a", clock=clock)
    own = make_memory(extractor=TypedNames(), session_id="b", clock=clock)
    for memory in (first, own):
        for n in range(3):
            save(memory, "Sarah/PERSON", f"n{n}")
    own.set_retention(keep_last=2)
    with Store(database_url) as store:
        admin = AdminRepository(store)
        admin.set_retention(None, keep_last=1)
        assert admin.prune(dry_run=True)["snippets"] == 2 + 1
        assert admin.prune() == {"sessions": 0, "turns": 0, "snippets": 3, "entities": 0}
    assert len(first.entity_store["Sarah"].contexts) == 1
    assert len(own.entity_store["Sarah"].contexts) == 2


def _mixed_session(memory, clock) -> None:
    for n in range(30):
        kind = "ORG" if n % 3 == 0 else "PERSON"
        save(memory, f"Name{n % 7}/{kind}, Hot/PERSON", f"turn {n}")
        if n % 10 == 0:
            memory.entity_store["Hot"].add_context(f"note {n}")
        clock.now += DAY
    memory.set_retention(keep_last=4, max_age=timedelta(days=20))
    memory.set_retention(keep_last=1, max_age=timedelta(days=8), entity_type="ORG")


def test_a_dry_run_counts_what_the_real_run_deletes(memory, clock, database_url):
    _mixed_session(memory, clock)
    before = [stored(database_url, t) for t in ("turns", "contexts", "entities")]

    planned = memory.prune(dry_run=True)

    assert [stored(database_url, t) for t in ("turns", "contexts", "entities")] == before
    store, small = pruner(database_url, clock, batch_size=3)
    with store:
        assert small.prune("s1").as_dict() == planned
    assert planned["turns"] == 10 and planned["snippets"] > planned["turns"]
    assert memory.prune(dry_run=True) == {"sessions": 0, "turns": 0, "snippets": 0, "entities": 0}


class Interrupted(Exception):
    pass


def test_an_interrupted_prune_finishes_when_run_again(memory, clock, database_url):
    _mixed_session(memory, clock)
    planned = memory.prune(dry_run=True)
    shown_before = {name: memory.entity_store[name].contexts for name in memory.list_entities()}
    store, small = pruner(database_url, clock, batch_size=2)
    real_write, writes = core_of(store).write, []

    def failing_write(work, lock=None):
        if len(writes) == 3:
            raise Interrupted
        writes.append(1)
        return real_write(work, lock)

    core_of(store).write = failing_write  # type: ignore[method-assign]
    with store, pytest.raises(Interrupted):
        small.prune("s1")
    assert memory.prune(dry_run=True) != planned  # three batches went through

    with Store(database_url) as again:
        Pruner(core_of(again), now=clock, batch_size=2).prune("s1")

    assert memory.prune(dry_run=True)["snippets"] == 0
    shown_after = {name: memory.entity_store[name].contexts for name in memory.list_entities()}
    assert shown_after == shown_before  # what showed is what stays


def test_prune_concurrent_with_saves_loses_no_turn_the_policy_keeps(memory, clock, database_url):
    for n in range(200):
        save(memory, f"Name{n % 20}/PERSON", f"old {n}")
    memory.set_retention(keep_last=2)
    saver = memory.store  # the same store: saves and batches interleave on its pool
    saved: list[str] = []
    done = threading.Event()

    def keep_saving() -> None:
        n = 0
        while not done.is_set() and n < 300:
            save(memory, f"New{n % 5}/PERSON", f"new {n}")
            saved.append(f"New{n % 5}/PERSON | new {n}")
            n += 1

    thread = threading.Thread(target=keep_saving)
    thread.start()
    try:
        with Store(database_url) as store:
            Pruner(core_of(store), now=clock, batch_size=7).prune("s1")
    finally:
        done.set()
        thread.join()

    inputs = {turn["input"] for turn in memory.chat_memory}
    assert set(saved) <= inputs
    assert len(inputs) == 200 + len(saved)
    for n in range(5):
        if any(s.startswith(f"New{n}/") for s in saved):
            newest = [s for s in saved if s.startswith(f"New{n}/")][-2:]
            assert memory.entity_store[f"New{n}"].contexts[-len(newest) :] == [
                f"{s} ok" for s in newest
            ]
    assert saver is memory.store


@pytest.mark.fans_out
def test_forget_and_prune_leave_no_ledger_error_naming_the_erased_data(
    make_memory, clock, database_url
):
    class Failing:
        name = "failing"

        def extract(self, text: str) -> list[str]:
            raise RuntimeError(f"model refused: {text}")

    broken = make_memory(extractor=Failing(), session_id="s1", clock=clock)
    broken.save_context({"input": "Sarah Connor called"}, {"output": "ok"})
    memory = make_memory(extractor=TypedNames(), session_id="s1", clock=clock)
    save(memory, "Sarah Connor/PERSON", "again")

    memory.forget_entity("Sarah Connor")

    with Store(database_url) as store, core_of(store).query() as connection:
        errors = connection.execute(sa.text("SELECT error FROM extractions")).scalars().all()
    assert not any(error and "Sarah" in error for error in errors)

    clock.now += 10 * DAY
    save(memory, "Tom/PERSON", "new")
    memory.set_retention(max_age=timedelta(days=5))
    memory.prune()
    assert stored(database_url, "extractions") == 1  # only Tom's turn's


def test_the_sweeper_starts_prunes_and_stops(memory, clock, database_url):
    for n in range(4):
        save(memory, "Sarah/PERSON", f"n{n}")
    memory.set_retention(keep_last=1)
    with Store(database_url) as store:
        sweeper = start_sweeper(store, interval=0.05, now=clock)
        for _ in range(200):
            if sweeper.rounds:
                break
            threading.Event().wait(0.05)
        sweeper.stop()
        assert not sweeper.running
        assert sweeper.last_receipt.snippets == 3
    assert stored(database_url, "contexts") == 1


def test_closing_the_store_stops_its_sweeper(database_url):
    store = Store(database_url)
    sweeper = start_sweeper(store, interval=3600)
    assert sweeper.running
    store.close()
    assert not sweeper.running


def test_settings_are_checked(memory):
    with pytest.raises(ValueError, match="keep_last"):
        memory.set_retention(keep_last=0)
    with pytest.raises(ValueError, match="max_age"):
        memory.set_retention(max_age=timedelta(0))
    with pytest.raises(ValueError, match="session_idle"):
        memory.set_retention(session_idle=60, entity_type="ORG")
    with pytest.raises(ValueError, match="needs"):
        memory.set_retention()
    assert memory.get_retention()["source"] is None
    memory.set_retention(keep_last=2)
    assert memory.clear_retention() == 1
    assert memory.get_retention()["source"] is None


# -- the fourth hardening round, H14: a sweeper's interval ------------------------------------


@pytest.mark.parametrize("interval", [math.inf, 1e10, math.nan, 0, -1, 366 * 86_400 + 1])
def test_a_sweeper_interval_past_a_year_or_not_positive_is_refused(database_url, interval):
    with Store(database_url) as store, pytest.raises(ValueError, match="at most 31,622,400"):
        start_sweeper(store, interval=interval)


@pytest.mark.parametrize("interval", ["60", True, None])
def test_a_sweeper_interval_that_is_no_number_is_refused(database_url, interval):
    with Store(database_url) as store, pytest.raises(TypeError, match="a number of seconds"):
        start_sweeper(store, interval=interval)


def test_a_sweeper_of_a_years_interval_keeps_running(database_url):
    with Store(database_url) as store:
        sweeper = start_sweeper(store, interval=366 * 86_400)
        deadline = time.monotonic() + 10
        while sweeper.rounds == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert sweeper.rounds == 1 and sweeper.running
