"""The row mapping: one builder per table for what an insert writes (shared by saves,
repairs and imports), and one converter per record for what a read returns.

Builders give exactly the columns :func:`schema.insert_columns` derives from the table
(a unit test holds them to it); converters read rows by column name.
"""

from __future__ import annotations

from typing import Any

from ..model.records import EntityRecord, NewTurn, Outcome, PendingTurn, TurnRecord


def turn_row(
    session_id: str,
    *,
    input_text: str,
    output_text: str,
    entity_names: list[str],
    created_at: float,
    idempotency_key: str | None,
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "input_text": input_text,
        "output_text": output_text,
        "entity_names": entity_names,
        "created_at": created_at,
        "idempotency_key": idempotency_key,
    }


def entity_row(
    session_id: str,
    *,
    name_key: str,
    core_key: str,
    name: str,
    entity_type: str,
    first_seen: float,
    last_seen: float,
    first_turn_id: int,
    first_position: int,
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "name_key": name_key,
        "core_key": core_key,
        "name": name,
        "entity_type": entity_type,
        "first_seen": first_seen,
        "last_seen": last_seen,
        "first_turn_id": first_turn_id,
        "first_position": first_position,
    }


def context_row(
    session_id: str,
    *,
    entity_id: int,
    turn_id: int | None,
    turn_seq: int,
    text: str,
    created_at: float,
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "entity_id": entity_id,
        "turn_id": turn_id,
        "turn_seq": turn_seq,
        "text": text,
        "created_at": created_at,
    }


def outcome_row(
    session_id: str,
    *,
    turn_id: int,
    extractor: str,
    status: str,
    error: str | None,
    latency_ms: float,
    entity_count: int,
    attempts: int,
    updated_at: float,
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "turn_id": turn_id,
        "extractor": extractor,
        "status": status,
        "error": error,
        "latency_ms": latency_ms,
        "entity_count": entity_count,
        "attempts": attempts,
        "updated_at": updated_at,
    }


def ledger_values(outcome: Outcome, entity_count: int, at: float) -> dict[str, Any]:
    """The ledger columns that say how an extraction went."""
    return {
        "extractor": outcome.extractor,
        "status": outcome.status,
        "error": outcome.error,
        "latency_ms": outcome.latency * 1000,
        "entity_count": entity_count,
        "updated_at": at,
    }


def new_turn_row(session_id: str, turn: NewTurn) -> dict[str, Any]:
    return turn_row(
        session_id,
        input_text=turn.input_text,
        output_text=turn.output_text,
        entity_names=[mention.name for mention in turn.mentions],
        created_at=turn.created_at,
        idempotency_key=turn.idempotency_key,
    )


def new_outcome_row(session_id: str, turn_id: int, turn: NewTurn) -> dict[str, Any]:
    values = ledger_values(turn.outcome, len(turn.mentions), turn.created_at)
    return outcome_row(session_id, turn_id=turn_id, attempts=1, **values)


def entity_record(row: Any) -> EntityRecord:
    """An entity from a row holding the columns of ``statements.ENTITY_SELECT``."""
    return EntityRecord(
        row.id, row.name, row.name_key, row.entity_type, row.first_seen, row.last_seen
    )


def turn_record(row: Any) -> TurnRecord:
    return TurnRecord(row.id, row.input_text, row.output_text, list(row.entity_names))


def pending_turn(row: Any) -> PendingTurn:
    return PendingTurn(row.id, row.session_id, row.input_text, row.output_text, row.created_at)
