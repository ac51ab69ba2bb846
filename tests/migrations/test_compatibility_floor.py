"""The compatibility floor, on both backends: a process of this release starts on a schema
that a later release expanded (a revision it does not know), and refuses, naming the step
and what to do, once a later release's contract step raised the floor above it.

The later release is two test-only revisions written to a folder of their own beside the
packaged ones (Alembic's ``version_locations``): an expansion beyond this release's head,
then a contract step that raises the floor as a real one would."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from tests.cli.helpers import invoke, one_line_error, succeeded
from tests.doubles import FixedLLM
from tests.migrations.released import rows
from zerda_store import ConversationEntityMemory, SchemaNotCurrentError, Store, migrate
from zerda_store.db.migration import compatibility
from zerda_store.db.migration.lock import locked_connection
from zerda_store.db.migration.survey import Survey, survey
from zerda_store.db.store import core_of

EXPAND, CONTRACT = "9901", "9902"
FLOOR = "SELECT raised_by, floor_revision FROM compatibility_floor ORDER BY raised_by"

EXPANSION = '''"""A later release's expansion (test only): a table and a nullable column."""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "later_notes",
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_later_notes"),
    )
    op.add_column("turns", sa.Column("later_flag", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("later_flag")
    op.drop_table("later_notes")
'''

CONTRACTION = '''"""A later release's contract step (test only): the floor rises to its revision."""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_table("later_notes")
    op.execute(
        "INSERT INTO compatibility_floor (raised_by, floor_revision, reason, raised_at) "
        "VALUES ('{revision}', '{revision}', 'dropped later_notes', 1800000000)"
    )


def downgrade() -> None:
    op.execute("DELETE FROM compatibility_floor WHERE raised_by = '{revision}'")
    op.create_table(
        "later_notes",
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_later_notes"),
    )
'''


@pytest.fixture
def later_release(tmp_path: Path) -> Config:
    """The Alembic configuration of a later release: this one's revisions and two more."""
    folder = tmp_path / "later_versions"
    folder.mkdir()
    head = migrate.head_revision()
    (folder / f"{EXPAND}_later_expansion.py").write_text(
        EXPANSION.format(revision=EXPAND, down=head), encoding="utf-8"
    )
    (folder / f"{CONTRACT}_later_contraction.py").write_text(
        CONTRACTION.format(revision=CONTRACT, down=EXPAND), encoding="utf-8"
    )
    config = migrate.alembic_config()
    config.set_main_option("path_separator", "os")
    versions = migrate.migrations_dir() / "versions"
    config.set_main_option("version_locations", os.pathsep.join((str(versions), str(folder))))
    return config


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    with Store(database_url) as store:
        yield store


def _migrate(store: Store, config: Config, revision: str, *, up: bool = True) -> None:
    """Migrate as the later release's `db upgrade` / `db downgrade` would."""
    with locked_connection(store) as connection:
        config.attributes["connection"] = connection
        (command.upgrade if up else command.downgrade)(config, revision)


def _starts(url: str) -> None:
    """A process of this release starts on the database, saves and recalls."""
    memory = ConversationEntityMemory(llm=FixedLLM("Ada"), database_url=url, session_id="crm")
    with memory:
        memory.save_context({"input": "Ada called"}, {"output": "noted"})
        recalled = memory.load_memory_variables({"input": "Ada?"})["entity_info"]
        assert recalled.endswith("Ada called noted")


def test_this_release_starts_on_a_schema_a_later_release_expanded(
    store: Store, later_release: Config, database_url: str
) -> None:
    floor = rows(store, FLOOR)

    _migrate(store, later_release, EXPAND)

    assert rows(store, FLOOR) == floor  # an expand step leaves the floor alone
    _starts(database_url)
    for auto_migrate in (False, True):  # never migrated by the older release
        ConversationEntityMemory(database_url=database_url, auto_migrate=auto_migrate).close()
    assert migrate.current_revision(store) == EXPAND
    listed = succeeded(invoke(database_url, "entities", "--session", "crm"))
    assert "Ada" in listed.stdout


def test_this_release_refuses_to_start_once_a_later_contract_step_raised_the_floor(
    store: Store, later_release: Config, database_url: str
) -> None:
    _migrate(store, later_release, CONTRACT)

    with pytest.raises(SchemaNotCurrentError) as refused:
        ConversationEntityMemory(database_url=database_url, auto_migrate=True)

    message = str(refused.value)
    assert f"is at revision {CONTRACT}, and this version of zerda_store" in message
    assert (
        f"revision {CONTRACT} raised its compatibility floor to revision {CONTRACT} "
        "(dropped later_notes)"
    ) in message
    assert (
        f"Run a newer version of zerda_store on this server, one that has revision {CONTRACT}"
        in message
    )
    assert migrate.current_revision(store) == CONTRACT
    error = one_line_error(invoke(database_url, "entities", "--session", "crm"))
    assert f"raised its compatibility floor to revision {CONTRACT}" in error

    _migrate(store, later_release, EXPAND, up=False)  # the later release undoes its step

    _starts(database_url)


def test_this_release_does_not_migrate_a_later_releases_schema(
    store: Store, later_release: Config, database_url: str
) -> None:
    _migrate(store, later_release, EXPAND)

    for args in (("db", "upgrade"), ("db", "contract"), ("db", "downgrade", "0011", "--yes")):
        error = one_line_error(invoke(database_url, *args))
        assert f"at revision {EXPAND}, newer than this version of zerda_store knows" in error
        assert "This version runs on it, but only that release (or a later one)" in error

    _migrate(store, later_release, CONTRACT)
    error = one_line_error(invoke(database_url, "db", "upgrade"))
    assert f"raised its compatibility floor to revision {CONTRACT}" in error
    assert migrate.current_revision(store) == CONTRACT


def test_a_schema_behind_head_still_asks_for_db_upgrade(empty_database_url: str) -> None:
    with Store(empty_database_url) as store:
        migrate.upgrade(store, "0011")

    with pytest.raises(SchemaNotCurrentError, match=r"at revision 0011, .* needs .*db upgrade"):
        ConversationEntityMemory(database_url=empty_database_url, auto_migrate=False)


def test_db_contract_raises_the_floor_above_the_releases_before_its_columns(
    store: Store, database_url: str
) -> None:
    assert rows(store, FLOOR) == [("0012", "0004")]

    succeeded(invoke(database_url, "db", "contract"))
    succeeded(invoke(database_url, "db", "contract"))  # nothing to contract: recorded once

    assert rows(store, FLOOR) == [("0012", "0004"), ("db contract", "0006")]
    # A release that knows revisions up to 0005 would now refuse, naming the step.
    older = frozenset(f"{n:04d}" for n in range(1, 6))
    found = _survey_at(store, "0013")
    with pytest.raises(SchemaNotCurrentError) as refused:
        compatibility.require_runnable(core_of(store), found, older, "0005")
    assert "`zerda-store db contract` raised its compatibility floor to revision 0006" in str(
        refused.value
    )
    compatibility.require_runnable(core_of(store), found, older | {"0006"}, "0006")


def test_revision_0012_records_a_contract_made_before_it(empty_database_url: str) -> None:
    with Store(empty_database_url) as store:
        migrate.upgrade(store, "0011")
        _drop_previous_release_defaults(store)

        migrate.upgrade(store)

        assert rows(store, FLOOR) == [("0012", "0004"), ("db contract", "0006")]


def _survey_at(store: Store, revision: str) -> Survey:
    """What a process would find if the version table said ``revision``."""
    return dataclasses.replace(survey(store), revision=revision)


def _drop_previous_release_defaults(store: Store) -> None:
    from zerda_store.db.migration.contract import contract
    from zerda_store.db.store import core_of

    contract(core_of(store), "0011", "0011")  # as `db contract` did at 0011
    with store.connect() as connection:
        assert sa.inspect(connection).has_table("compatibility_floor") is False
