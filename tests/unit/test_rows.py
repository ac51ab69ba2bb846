"""The row builders write exactly the columns the schema's inserts take."""

from __future__ import annotations

import pytest

from zerda_store.db.schema import contexts, entities, extractions, insert_columns, turns
from zerda_store.model.records import Mention, NewTurn, Outcome
from zerda_store.turns import rows


def test_the_builders_give_each_insert_column_once_in_table_order():
    built = {
        turns: rows.turn_row(
            "s",
            input_text="i",
            output_text="o",
            entity_names=[],
            created_at=1.0,
            idempotency_key=None,
        ),
        entities: rows.entity_row(
            "s",
            name_key="k",
            core_key="k",
            name="K",
            entity_type="unknown",
            first_seen=1.0,
            last_seen=1.0,
            first_turn_id=1,
            first_position=0,
        ),
        contexts: rows.context_row(
            "s", entity_id=1, turn_id=1, turn_seq=1, text="t", created_at=1.0
        ),
        extractions: rows.outcome_row(
            "s",
            turn_id=1,
            extractor="llm",
            status="ok",
            error=None,
            latency_ms=0.0,
            entity_count=0,
            attempts=1,
            updated_at=1.0,
        ),
    }
    for table, row in built.items():
        assert tuple(row) == insert_columns(table), table.name


@pytest.mark.parametrize("outcome", [Outcome("llm", "ok"), Outcome("llm", "failed", "boom", 0.25)])
def test_a_new_turn_and_its_ledger_row_carry_what_was_extracted(outcome):
    mentions = [Mention("Sarah", "sarah", "PERSON"), Mention("Acme", "acme")]
    turn = NewTurn("Sarah from Acme", "ok", mentions, 10.0, "message-1", outcome)
    assert rows.new_turn_row("s", turn)["entity_names"] == ["Sarah", "Acme"]
    ledger = rows.new_outcome_row("s", 7, turn)
    assert (ledger["turn_id"], ledger["status"], ledger["error"]) == (
        7,
        outcome.status,
        outcome.error,
    )
    assert ledger["latency_ms"] == outcome.latency * 1000
    assert ledger["entity_count"] == 2
