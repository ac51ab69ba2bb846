from __future__ import annotations

from tests.doubles import FixedLLM


def test_turn_is_recalled_by_a_later_input(make_memory):
    memory = make_memory(FixedLLM("Sarah, Acme Corp"))
    memory.save_context({"input": "Sarah joined Acme Corp."}, {"output": "Noted."})
    recalled = memory.load_memory_variables({"input": "What about Sarah?"})["entity_info"]
    assert recalled.startswith("Previous information about Sarah:\nSarah joined Acme Corp. Noted.")
