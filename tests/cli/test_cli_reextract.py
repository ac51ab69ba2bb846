"""`reextract --failed`: turns whose extraction failed are retried. The command uses stanza,
which has no model here, so the turns stay failed without a crash; `memory.reextract()` with
an LLM that works again repairs them in their own place in the conversation."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from tests.cli.helpers import VOCABULARY, invoke, json_of, succeeded
from tests.support import BrokenLLM, KeywordLLM
from zerda_store.db.schema import extractions, in_same_session, turns

FLAKY = (
    ("ok", "Sarah Chen joined Acme Corp.", "Welcome aboard."),
    ("failed", "Sarah Chen asked about Berlin.", "I will check."),
    ("ok", "Acme Corp and Sarah Chen signed.", "Congratulations."),
    ("failed", "Omar Haddad called Sarah Chen.", "Noted."),
)


def ledger(url: str, session_id: str) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(
                sa.select(
                    extractions.c.status,
                    extractions.c.attempts,
                    extractions.c.extractor,
                    extractions.c.error,
                    turns.c.created_at,
                )
                .join(turns, in_same_session(turns.c.id, extractions.c.turn_id))
                .where(extractions.c.session_id == session_id)
                .order_by(turns.c.id)
            ).all()
    finally:
        engine.dispose()


def write_flaky_sessions(make_memory) -> None:
    good = make_memory(KeywordLLM(VOCABULARY), session_id="flaky")
    broken = make_memory(BrokenLLM(), session_id="flaky")
    for outcome, user, assistant in FLAKY:
        memory = good if outcome == "ok" else broken
        memory.save_context({"input": user}, {"output": assistant})
    make_memory(BrokenLLM(), session_id="steady").save_context(
        {"input": "Globex wrote."}, {"output": "Thanks."}
    )


@pytest.mark.fans_out
def test_reextract_without_a_model_reports_the_turns_still_failing(
    database_url, make_memory, tmp_path
):
    write_flaky_sessions(make_memory)
    assert [row.status for row in ledger(database_url, "flaky")] == [
        "ok",
        "failed",
        "ok",
        "failed",
    ]
    before = json_of(invoke(database_url, "entities", "--session", "flaky", "--json"))
    no_models = tmp_path / "no-stanza-models"
    no_models.mkdir()

    flaky = ("reextract", "--failed", "--session", "flaky", "--stanza-dir", str(no_models))
    result = invoke(database_url, *flaky)

    assert result.exit_code == 1
    assert result.stdout.strip() == "repaired 0 turns, 2 still failing"
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith("Error: 2 turns still failing: ModelNotAvailableError: stanza model")
    assert "zerda-store models download en" in error
    rows = ledger(database_url, "flaky")
    assert [(row.status, row.attempts) for row in rows] == [
        ("ok", 1),
        ("failed", 2),
        ("ok", 1),
        ("failed", 2),
    ]
    assert all("stanza" in row.error for row in rows if row.status == "failed")
    assert [(row.status, row.attempts) for row in ledger(database_url, "steady")] == [("failed", 1)]
    assert json_of(invoke(database_url, "entities", "--session", "flaky", "--json")) == before

    result = invoke(database_url, "reextract", "--failed", "--stanza-dir", str(no_models), "--json")
    assert result.exit_code == 1
    every = json.loads(result.stdout)
    assert (every["repaired"], every["failed"]) == (0, 3)
    assert "stanza model" in every["error"]
    assert [row.attempts for row in ledger(database_url, "steady")] == [2]

    # then the LLM works again: the Python method repairs them in turn order
    memory = make_memory(KeywordLLM(VOCABULARY), session_id="flaky")
    assert memory.reextract() == {"repaired": 2, "failed": 0}

    texts = [f"{user} {assistant}" for _, user, assistant in FLAKY]
    assert memory.entity_store["Sarah Chen"].contexts == texts
    assert memory.list_entities() == ["Sarah Chen", "Acme Corp", "Berlin", "Omar Haddad"]
    assert [turn["entities"] for turn in memory.chat_memory] == [
        ["Sarah Chen", "Acme Corp"],
        ["Sarah Chen", "Berlin"],
        ["Acme Corp", "Sarah Chen"],
        ["Omar Haddad", "Sarah Chen"],
    ]
    rows = ledger(database_url, "flaky")
    assert [(row.status, row.attempts) for row in rows] == [
        ("ok", 1),
        ("ok", 4),
        ("ok", 1),
        ("ok", 4),
    ]
    berlin = memory.get_entity_info("Berlin")
    assert berlin["first_seen"] == berlin["last_seen"] == rows[1].created_at
    assert memory.get_entity_info("Sarah Chen")["last_seen"] == rows[3].created_at
    stats = memory.get_memory_stats()

    # twice adds nothing twice
    assert memory.reextract() == {"repaired": 0, "failed": 0}
    assert memory.entity_store["Sarah Chen"].contexts == texts
    assert memory.get_memory_stats() == stats
    again = succeeded(invoke(database_url, *flaky))
    assert again.stdout.strip() == "repaired 0 turns, 0 still failing"
    # the other session is still waiting for its own repair
    assert [row.status for row in ledger(database_url, "steady")] == ["failed"]


def test_reextract_needs_the_failed_flag(sqlite_url):
    result = invoke(sqlite_url, "reextract", "--session", "flaky")
    assert result.exit_code == 2
    assert "--failed" in result.stderr


def test_models_download_without_network_is_one_line(monkeypatch, tmp_path):
    # Every request goes through a proxy that is not there: what a machine offline sees.
    for variable in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(variable, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    result = invoke(None, "models", "download", "en", "--stanza-dir", str(tmp_path / "models"))

    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("Error: cannot download stanza models for 'en'")
    assert "network access" in result.stderr
    assert "Traceback" not in result.output
