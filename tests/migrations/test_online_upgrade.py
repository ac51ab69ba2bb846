"""`db upgrade` on Postgres commits revision by revision, and 0005 backfills
``contexts.created_at`` in batches of short transactions after its column is committed:
the snippets get the times one transaction gave them, the schema is the same (NOT NULL,
no constraint left behind), and a run interrupted mid-backfill goes on where it stopped."""

from __future__ import annotations

import pytest

from tests.migrations.released import released_database, rows, save_turns
from zerda_store import Store, migrate

BATCH_ROWS = 20_000  # as in revision 0005
FAR_ID = 2 * BATCH_ROWS + 7  # a note two batches further on
HELPER_CHECK = "ck_contexts_created_at_backfilled"
ON_POSTGRES = pytest.mark.parametrize(
    "empty_database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def _released_with_a_far_note(store: Store) -> None:
    """Two turns' snippets (turn time 1,700,000,000) and a note of no turn whose id lies
    two backfill batches further on (its entity's last_seen: 1,700,000,500)."""
    released_database(store)
    save_turns(store, "crm", [["Ada", "Acme Corp"], ["Ada"]])
    with store.connect() as connection, connection.begin():
        connection.exec_driver_sql("UPDATE entities SET last_seen = 1700000500")
        connection.exec_driver_sql(
            "INSERT INTO contexts (id, session_id, entity_id, turn_id, turn_seq, text) "
            f"SELECT {FAR_ID}, 'crm', MIN(id), NULL, 99, 'a note' FROM entities"
        )


def _times(store: Store) -> list[tuple[object, ...]]:
    return rows(store, "SELECT id, turn_id IS NULL, created_at FROM contexts ORDER BY id")


EXPECTED = [
    (1, False, 1_700_000_000.0),
    (2, False, 1_700_000_000.0),
    (3, False, 1_700_000_000.0),
    (FAR_ID, True, 1_700_000_500.0),
]


def test_the_retention_revision_gives_every_snippet_its_time_across_batches(
    empty_database_url: str,
) -> None:
    with Store(empty_database_url) as store:
        _released_with_a_far_note(store)

        migrate.upgrade(store)

        assert _times(store) == EXPECTED
        migrate.check(store)  # NOT NULL with its default, as the model has it
        if store.dialect == "postgresql":
            assert rows(
                store, "SELECT COUNT(*) FROM pg_constraint WHERE conname = :name", name=HELPER_CHECK
            ) == [(0,)]


def _stopped_within(store: Store, revision: str, *undone: str) -> None:
    """The released database upgraded through ``revision``, then ``undone`` run and the
    revision unstamped: as a run of ``revision`` that stopped before its end."""
    _released_with_a_far_note(store)
    migrate.upgrade(store, revision)
    before = f"{int(revision) - 1:04d}"
    with store.connect() as connection, connection.begin():
        for statement in undone:
            connection.exec_driver_sql(statement)
        connection.exec_driver_sql(f"UPDATE alembic_version SET version_num = '{before}'")


@ON_POSTGRES
def test_a_retention_revision_interrupted_mid_backfill_goes_on_where_it_stopped(
    empty_database_url: str,
) -> None:
    with Store(empty_database_url) as store:
        # As a run stopped after the column's commit, one batch backfilled.
        _stopped_within(
            store,
            "0005",
            "ALTER TABLE contexts ALTER COLUMN created_at DROP NOT NULL",
            "UPDATE contexts SET created_at = NULL WHERE id >= 3",
        )

        migrate.upgrade(store)

        assert _times(store) == EXPECTED
        migrate.check(store)
        assert migrate.current_revision(store) == migrate.head_revision()


def _unvalidated_keys_and_building_indexes(store: Store) -> list[tuple[object, ...]]:
    return rows(
        store,
        "SELECT conname FROM pg_constraint WHERE contype = 'f' AND NOT convalidated "
        "UNION ALL SELECT indexname FROM pg_indexes WHERE indexname LIKE '%building'",
    )


@ON_POSTGRES
def test_the_keys_revision_leaves_every_foreign_key_validated_and_resumes_after_its_swap(
    empty_database_url: str,
) -> None:
    with Store(empty_database_url) as store:
        # As a run stopped after the keys' swap, before the foreign keys' validation.
        _stopped_within(store, "0007")

        migrate.upgrade(store)

        assert _unvalidated_keys_and_building_indexes(store) == []
        assert _times(store) == EXPECTED
        migrate.check(store)
        assert rows(
            store,
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'pk_contexts'",
        ) == [("CREATE UNIQUE INDEX pk_contexts ON public.contexts USING btree (id, session_id)",)]
