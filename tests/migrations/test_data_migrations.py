"""Data through the migrations with pytest-alembic's runner, on the backend chosen by
``ZERDA_TEST_ALEMBIC_BACKEND`` (see conftest.py): rows written before a revision are
still there, and as that revision wants them, after it and at head."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

FIRST_REVISION = "0001"
LEDGER_REVISION = "0002"  # adds the extraction ledger and backfills it
RETENTION_REVISION = "0005"  # adds contexts.created_at and backfills it


def _rows(connection: sa.Connection, query: str) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in connection.exec_driver_sql(query)]


def _write_one_turn(alembic_runner: Any, connection: sa.Connection) -> None:
    alembic_runner.insert_into(
        "turns",
        {
            "session_id": "customer-1",
            "input_text": "Ada joined Acme Corp",
            "output_text": "noted",
            "entity_names": ["Ada", "Acme Corp"],
            "created_at": 1_700_000_001.0,
            "idempotency_key": "msg-1",
        },
    )
    turn_id = connection.exec_driver_sql("SELECT id FROM turns").scalar_one()
    for position, name in enumerate(["Ada", "Acme Corp"]):
        alembic_runner.insert_into(
            "entities",
            {
                "session_id": "customer-1",
                "name_key": name.casefold(),
                "name": name,
                "entity_type": "unknown",
                "first_seen": 1_700_000_001.0,
                "last_seen": 1_700_000_001.0,
                "first_turn_id": turn_id,
                "first_position": position,
            },
        )
    entity_ids = connection.exec_driver_sql("SELECT id FROM entities ORDER BY id").scalars().all()
    alembic_runner.insert_into(
        "contexts",
        [
            {
                "session_id": "customer-1",
                "entity_id": entity_id,
                "turn_id": turn_id,
                "turn_seq": turn_id,
                "text": "Ada joined Acme Corp noted",
            }
            for entity_id in entity_ids
        ],
    )


def test_rows_of_the_first_revision_survive_to_head(
    alembic_runner: Any, alembic_engine: sa.Connection
) -> None:
    alembic_runner.migrate_up_to(FIRST_REVISION)
    _write_one_turn(alembic_runner, alembic_engine)
    before = {
        table: _rows(alembic_engine, f"SELECT * FROM {table} ORDER BY id")
        for table in ("turns", "entities", "contexts")
    }

    alembic_runner.migrate_up_to("heads")

    for table, rows in before.items():
        columns = ", ".join(
            alembic_runner.table_at_revision(table, revision=FIRST_REVISION).c.keys()
        )
        assert _rows(alembic_engine, f"SELECT {columns} FROM {table} ORDER BY id") == rows, table


def test_the_ledger_revision_records_turns_saved_before_it_as_extracted(
    alembic_runner: Any, alembic_engine: sa.Connection
) -> None:
    alembic_runner.migrate_up_before(LEDGER_REVISION)
    _write_one_turn(alembic_runner, alembic_engine)

    alembic_runner.migrate_up_one()

    assert alembic_runner.current == LEDGER_REVISION
    assert _rows(
        alembic_engine,
        "SELECT session_id, status, entity_count, attempts FROM extractions",
    ) == [("customer-1", "ok", 2, 1)]


def test_the_retention_revision_gives_snippets_their_turns_time_and_notes_their_entitys(
    alembic_runner: Any, alembic_engine: sa.Connection
) -> None:
    alembic_runner.migrate_up_before(RETENTION_REVISION)
    _write_one_turn(alembic_runner, alembic_engine)
    alembic_engine.exec_driver_sql("UPDATE entities SET last_seen = 1700000500.0")
    entity_id = alembic_engine.exec_driver_sql("SELECT MIN(id) FROM entities").scalar_one()
    alembic_runner.insert_into(
        "contexts",
        {
            "session_id": "customer-1",
            "entity_id": entity_id,
            "turn_id": None,
            "turn_seq": 99,
            "text": "a note",
        },
    )

    alembic_runner.migrate_up_one()

    assert alembic_runner.current == RETENTION_REVISION
    assert _rows(
        alembic_engine, "SELECT turn_id IS NULL, created_at FROM contexts ORDER BY id"
    ) == [(False, 1_700_000_001.0), (False, 1_700_000_001.0), (True, 1_700_000_500.0)]


IDENTITY_REVISION = "0006"  # re-keys sessions with the fold-v2 rules, merging collisions


def _write_entities(alembic_runner: Any, connection: sa.Connection, names: list[str]) -> None:
    """One turn naming ``names``, keyed as fold-v1 did (what 0005's library wrote)."""
    from zerda_store.model.names import FOLD_V1

    alembic_runner.insert_into(
        "turns",
        {
            "session_id": "s",
            "input_text": " ".join(names),
            "output_text": "ok",
            "entity_names": names,
            "created_at": 1_700_000_001.0,
            "idempotency_key": None,
        },
    )
    turn_id = connection.exec_driver_sql("SELECT MAX(id) FROM turns").scalar_one()
    for position, name in enumerate(names):
        alembic_runner.insert_into(
            "entities",
            {
                "session_id": "s",
                "name_key": FOLD_V1.key(name),
                "name": name,
                "entity_type": "unknown",
                "first_seen": 1_700_000_000.0 + turn_id,
                "last_seen": 1_700_000_000.0 + turn_id,
                "first_turn_id": turn_id,
                "first_position": position,
            },
        )
        entity_id = connection.exec_driver_sql("SELECT MAX(id) FROM entities").scalar_one()
        alembic_runner.insert_into(
            "contexts",
            {
                "session_id": "s",
                "entity_id": entity_id,
                "turn_id": turn_id,
                "turn_seq": turn_id,
                "text": f"about {name}",
                "created_at": 1_700_000_001.0,
            },
        )


def test_the_identity_revision_rekeys_and_merges_colliding_entities_through_the_log(
    alembic_runner: Any, alembic_engine: sa.Connection
) -> None:
    alembic_runner.migrate_up_before(IDENTITY_REVISION)
    _write_entities(alembic_runner, alembic_engine, ["Acme Corp", "Sarah"])
    _write_entities(alembic_runner, alembic_engine, ["Acme Corp.", "مدرسة"])
    _write_entities(alembic_runner, alembic_engine, ["مدرسه"])

    alembic_runner.migrate_up_one()

    assert _rows(alembic_engine, "SELECT name, name_key FROM entities ORDER BY id") == [
        ("Acme Corp", "acme corp"),
        ("Sarah", "sarah"),
        ("مدرسة", "مدرسه"),
    ]
    assert _rows(
        alembic_engine, "SELECT kept_name, merged_name, reason FROM entity_merges ORDER BY id"
    ) == [("Acme Corp", "Acme Corp.", "key rules"), ("مدرسة", "مدرسه", "key rules")]
    assert _rows(alembic_engine, "SELECT session_id, key_rules FROM session_key_rules") == [
        ("s", "fold-v2")
    ]
    counts = "SELECT e.name, COUNT(*) FROM contexts c JOIN entities e ON e.id = c.entity_id "
    assert dict(_rows(alembic_engine, counts + "GROUP BY e.name")) == {
        "Acme Corp": 2,
        "Sarah": 1,
        "مدرسة": 2,
    }


def test_a_session_with_exact_keys_keeps_them_through_the_identity_revision(
    alembic_runner: Any, alembic_engine: sa.Connection
) -> None:
    alembic_runner.migrate_up_before(IDENTITY_REVISION)
    _write_entities(alembic_runner, alembic_engine, ["Sarah"])
    alembic_engine.exec_driver_sql("UPDATE entities SET name_key = name")
    _write_entities(alembic_runner, alembic_engine, ["Acme Corp."])
    alembic_engine.exec_driver_sql("UPDATE entities SET name_key = name")

    alembic_runner.migrate_up_one()

    assert _rows(alembic_engine, "SELECT name_key FROM entities ORDER BY id") == [
        ("Sarah",),
        ("Acme Corp.",),
    ]
    assert _rows(alembic_engine, "SELECT key_rules FROM session_key_rules") == [("exact",)]


def test_three_entities_colliding_under_the_new_rules_become_one_with_every_field_combined(
    alembic_runner: Any, alembic_engine: sa.Connection
) -> None:
    alembic_runner.migrate_up_before(IDENTITY_REVISION)
    for name in ("Acme Corp", "Acme Corp.", "Acme-Corp"):
        _write_entities(alembic_runner, alembic_engine, [name])
    alembic_engine.exec_driver_sql(
        "UPDATE entities SET entity_type = 'ORG' WHERE name = 'Acme Corp.'"
    )
    last_seen = alembic_engine.exec_driver_sql("SELECT MAX(last_seen) FROM entities").scalar_one()

    alembic_runner.migrate_up_one()

    assert _rows(alembic_engine, "SELECT name, entity_type, last_seen FROM entities") == [
        ("Acme Corp", "ORG", last_seen)
    ]
    assert _rows(alembic_engine, "SELECT COUNT(*) FROM contexts") == [(3,)]
    assert _rows(alembic_engine, "SELECT merged_name FROM entity_merges ORDER BY id") == [
        ("Acme Corp.",),
        ("Acme-Corp",),
    ]
