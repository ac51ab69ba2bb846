"""A person's judgements of suggested pairs, on both backends: a confirmation merges
through the merge log and is undone exactly, a rejection is never suggested again until
undone, both record who decided and when, and they travel with export and import."""

from __future__ import annotations

import io
import time

import pytest

from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store
from zerda_store.admin import AdminRepository
from zerda_store.errors import MergeError
from zerda_store.transfer.format import read_session, write_session

NAMES = ("Mustafa Ali", "Moustafa Ali", "Peggy Ross", "Margaret Ross", "Samir", "Samira")


@pytest.fixture
def memory(make_memory):
    memory = make_memory(KeywordLLM(NAMES), session_id="crm")
    memory.save_context({"input": "Mustafa Ali and Peggy Ross called."}, {"output": "ok"})
    memory.save_context({"input": "Moustafa Ali paid; Margaret Ross too."}, {"output": "ok"})
    memory.save_context({"input": "Samir and Samira came."}, {"output": "ok"})
    return memory


def pairs(memory) -> list[tuple[str, str, str]]:
    return [(p["a"], p["b"], p["reason"]) for p in memory.similar_entities()]


def test_variants_are_suggested_with_a_score_and_never_merged(memory):
    assert pairs(memory) == [
        ("Mustafa Ali", "Moustafa Ali", "transliteration"),
        ("Peggy Ross", "Margaret Ross", "nickname"),
    ]
    assert all(0 < p["score"] <= 1 for p in memory.similar_entities())
    assert len(memory.list_entities()) == len(NAMES)


def test_a_rejected_pair_is_never_suggested_again_until_undone(memory):
    before = time.time()
    judgement = memory.reject_same("Peggy Ross", "Margaret Ross", by="nadia")
    assert judgement["verdict"] == "different"
    assert judgement["decided_by"] == "nadia"
    assert judgement["decided_at"] >= before - 1
    assert pairs(memory) == [("Mustafa Ali", "Moustafa Ali", "transliteration")]
    memory.save_context({"input": "Peggy Ross again."}, {"output": "ok"})
    assert pairs(memory) == [("Mustafa Ali", "Moustafa Ali", "transliteration")]
    assert [j["verdict"] for j in memory.judgements()] == ["different"]

    memory.undo_judgement("Margaret Ross", "Peggy Ross")
    assert ("Peggy Ross", "Margaret Ross", "nickname") in pairs(memory)
    assert memory.judgements() == []


def test_a_confirmation_merges_through_the_log_and_undo_unmerges(memory):
    entities_before = memory.list_entities()
    judgement = memory.confirm_same("Mustafa Ali", "Moustafa Ali")
    assert judgement["verdict"] == "same"
    assert judgement["decided_by"] == "api"
    assert memory.get_entity_info("Moustafa Ali")["name"] == "Mustafa Ali"
    (logged,) = memory.merges()
    assert (logged["merge_id"], logged["reason"]) == (judgement["merge_id"], "confirmed same")
    assert ("Mustafa Ali", "Moustafa Ali", "transliteration") not in pairs(memory)

    undone = memory.undo_judgement("Mustafa Ali", "Moustafa Ali")
    assert undone["verdict"] == "same"
    assert memory.list_entities() == entities_before
    assert memory.merges()[0]["undone_at"] is not None
    assert memory.judgements() == []


def test_judging_names_no_entity_or_one_entity_is_refused(memory):
    with pytest.raises(MergeError, match="no entity"):
        memory.reject_same("Peggy Ross", "Nobody")
    memory.confirm_same("Mustafa Ali", "Moustafa Ali")
    with pytest.raises(MergeError, match="one entity"):
        memory.reject_same("Mustafa Ali", "Moustafa Ali")
    with pytest.raises(MergeError, match="no judgement"):
        memory.undo_judgement("Samir", "Samira")
    with pytest.raises(ValueError, match="by"):
        memory.reject_same("Samir", "Samira", by="")


def test_judgements_travel_with_export_and_import(memory, database_url):
    memory.reject_same("Peggy Ross", "Margaret Ross", by="nadia")
    memory.confirm_same("Mustafa Ali", "Moustafa Ali", by="omar")
    with Store(database_url) as store:
        admin = AdminRepository(store)
        out = io.StringIO()
        write_session(out, "crm", admin.export_session("crm"), admin.key_rules("crm"))
        _, records = read_session(out.getvalue().splitlines(keepends=True))
        judged = [r for r in records if r["kind"] == "judgement"]
        assert [(r["verdict"], r["decided_by"]) for r in judged] == [
            ("different", "nadia"),
            ("same", "omar"),
        ]
        admin.import_session("copy", records, key_rules=admin.key_rules("crm"))
        with ConversationEntityMemory.for_session(store, "copy") as imported:
            assert [(j["a"], j["b"], j["verdict"]) for j in imported.judgements()] == [
                ("Margaret Ross", "Peggy Ross", "different"),
                ("Moustafa Ali", "Mustafa Ali", "same"),
            ]
            assert [(p["a"], p["b"]) for p in imported.similar_entities()] == []


def test_clear_deletes_the_judgements(memory):
    memory.reject_same("Samir", "Samira", by="nadia")
    memory.clear()
    assert memory.judgements() == []


def test_forgetting_an_entity_deletes_the_judgements_that_name_it(memory):
    memory.reject_same("Peggy Ross", "Margaret Ross", by="nadia")
    memory.confirm_same("Mustafa Ali", "Moustafa Ali", by="nadia")
    assert len(memory.judgements()) == 2

    memory.forget_entity("Margaret Ross")
    kept = memory.judgements()
    assert len(kept) == 1 and "ross" not in str(kept).casefold()

    memory.forget_entity("Mustafa Ali")  # the kept entity: its alias's judgement goes too
    assert memory.judgements() == []
