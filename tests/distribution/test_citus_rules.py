"""The schema against Citus's rules, read from the Postgres catalog after `alembic upgrade
head`: what holds, and exactly which constraints break a rule today (the README's "Running
on Citus" says what each needs)."""

from __future__ import annotations

import sqlalchemy as sa

from zerda_store import Store
from zerda_store.db.citus.distribution import (
    DISTRIBUTED_TABLES,
    KNOWN_EXCEPTIONS,
    NOT_BIGINT,
    REFERENCE_TABLES,
    UNIQUE,
    Violation,
    violations,
)


def test_the_migrated_schema_follows_every_citus_rule(postgres_url: str) -> None:
    with Store(postgres_url) as store, store.connect() as connection:
        assert violations(connection) == KNOWN_EXCEPTIONS == frozenset()


def test_every_table_is_either_distributed_by_session_or_a_reference_table(
    postgres_url: str,
) -> None:
    with Store(postgres_url) as store, store.connect() as connection:
        tables = set(sa.inspect(connection).get_table_names()) - {"alembic_version"}
        columns = {t: {c["name"] for c in sa.inspect(connection).get_columns(t)} for t in tables}
    assert tables == set(DISTRIBUTED_TABLES) | set(REFERENCE_TABLES)
    # A reference table is copied whole to every node: it needs no session (the floor).
    assert all("session_id" in columns[table] for table in DISTRIBUTED_TABLES)


def test_the_unique_constraints_and_generated_ids_already_follow_the_rules(
    postgres_url: str,
) -> None:
    with Store(postgres_url) as store, store.connect() as connection:
        uniques = connection.execute(
            sa.text(
                "SELECT conrelid::regclass::text, conname FROM pg_constraint "
                "WHERE contype = 'u' AND connamespace = current_schema()::text::regnamespace"
            )
        ).all()
        generated = connection.execute(
            sa.text(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND column_default LIKE 'nextval(%'"
            )
        ).all()
    # The checker looked at them (they exist) and found nothing to say.
    assert {table for table, _ in uniques} == {
        "turns",
        "entities",
        "extractions",
        "entity_aliases",
    }
    assert {(table, column) for table, column, _ in generated} == {
        (table, "id")
        for table in DISTRIBUTED_TABLES
        if table not in ("session_key_rules", "identity_judgements")
    }
    assert {data_type for _, _, data_type in generated} == {"bigint"}


def test_the_checker_finds_what_breaks_a_rule_and_accepts_what_follows_them(
    postgres_url: str,
) -> None:
    with Store(postgres_url) as store, store.connect() as connection, connection.begin():
        for change in (
            # Broken: a unique key without session_id, a 32-bit generated id.
            "ALTER TABLE entities ADD CONSTRAINT uq_bad UNIQUE (name_key)",
            "ALTER TABLE contexts ADD COLUMN counter serial",
            # Followed: the composite shape that README's "Running on Citus" describes.
            "ALTER TABLE turns ADD CONSTRAINT uq_turns_session_id_id UNIQUE (session_id, id)",
            "ALTER TABLE extractions ADD CONSTRAINT fk_paired FOREIGN KEY (session_id, turn_id) "
            "REFERENCES turns (session_id, id)",
        ):
            connection.exec_driver_sql(change)
        found = violations(connection)
        connection.rollback()
    assert found - KNOWN_EXCEPTIONS == {
        Violation("entities", "uq_bad", UNIQUE),
        Violation("contexts", "counter", NOT_BIGINT),
    }
    assert found >= KNOWN_EXCEPTIONS
