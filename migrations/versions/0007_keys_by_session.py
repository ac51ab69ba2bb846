"""Keys by session: every primary key and every foreign key between the tables includes
``session_id``, so that the tables can be distributed by session (Citus: a session's rows
of every table on one shard, ``zerda-store db distribute``).

Postgres: the primary keys of the tables with a generated id become ``(id, session_id)``
(id first, so that a row is still found by its id through the key's index), and the
foreign keys ``(session_id, entity_id)`` / ``(session_id, turn_id)`` referring to
them. SQLite keeps ``id`` as the primary key (an ``INTEGER PRIMARY KEY`` is what generates
the ids) and gains a unique ``(session_id, id)`` on turns and entities for the composite
foreign keys to refer to; the tables are rebuilt (batch mode), and the views that read
them dropped and made again around the rebuild (as revision 0005 left them); the rebuilt
tables count ids on past those that an unmerge of 0006's merges puts back (a merged
entity, the snippets dropped with it), so that no new row takes one.

On Postgres, when the revision runs in transactions of its own (``db upgrade``), the new
keys' indexes are built first with ``CREATE INDEX CONCURRENTLY`` (reads and writes go on),
then one short transaction swaps the keys onto them (``PRIMARY KEY USING INDEX``, foreign
keys ``NOT VALID``), having locked the tables first in the order saves lock them, and each
foreign key is validated in a transaction of its own (VALIDATE lets reads and writes go
on). Run so on SQLite, each table is rebuilt in short transactions
(``zerda_store.db.migration.sqlite_online``), the referred tables first. Re-run after an
interruption, it goes on where it stopped.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op
from alembic.operations import BatchOperations

from zerda_store.db.migration import sqlite_online

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

ENTITY_OVERVIEW = """
CREATE VIEW entity_overview AS
SELECT
    e.session_id,
    e.name,
    e.entity_type,
    (SELECT COUNT(*) FROM contexts c WHERE c.entity_id = e.id) AS contexts_count,
    e.first_seen,
    e.last_seen,
    (SELECT c.text FROM contexts c WHERE c.entity_id = e.id
     ORDER BY c.turn_seq DESC, c.id DESC LIMIT 1) AS last_context
FROM entities e
"""

ENTITY_SNIPPETS = """
CREATE VIEW entity_snippets AS
SELECT
    e.session_id,
    e.name,
    e.entity_type,
    ROW_NUMBER() OVER (
        PARTITION BY c.entity_id ORDER BY c.turn_seq DESC, c.id DESC
    ) AS recency,
    c.text,
    c.turn_id,
    t.created_at AS turn_created_at
FROM contexts c
JOIN entities e ON e.id = c.entity_id
LEFT JOIN turns t ON t.id = c.turn_id
"""

# (table, column, referred table): the foreign keys between the tables, all ON DELETE CASCADE.
FOREIGN_KEYS = (
    ("contexts", "entity_id", "entities"),
    ("contexts", "turn_id", "turns"),
    ("extractions", "turn_id", "turns"),
    ("entity_aliases", "entity_id", "entities"),
)
# In the order a save takes their locks (turns, entities, contexts, extractions), then the
# identity tables, which saves do not write.
KEYED_TABLES = ("turns", "entities", "contexts", "extractions", "entity_aliases", "entity_merges")
REFERRED = ("turns", "entities")
NEVER_REUSED = ("entities", "contexts", "entity_aliases")


def _single(table: str, column: str, referred: str) -> str:
    return f"fk_{table}_{column}_{referred}"


def _composite(table: str, referred: str) -> str:
    return f"fk_{table}_session_id_{referred}"


def _postgres(composite: bool) -> None:
    for table, column, referred in FOREIGN_KEYS:
        name = _single(table, column, referred) if composite else _composite(table, referred)
        op.drop_constraint(name, table, type_="foreignkey")
    for table in KEYED_TABLES:
        op.drop_constraint(f"pk_{table}", table, type_="primary")
        # id first: a row is still found by its id alone through the key's index.
        columns = ["id", "session_id"] if composite else ["id"]
        op.create_primary_key(f"pk_{table}", table, columns)
    for table, column, referred in FOREIGN_KEYS:
        if composite:
            op.create_foreign_key(
                _composite(table, referred),
                table,
                referred,
                ["session_id", column],
                ["session_id", "id"],
                ondelete="CASCADE",
            )
        else:
            op.create_foreign_key(
                _single(table, column, referred), table, referred, [column], ["id"],
                ondelete="CASCADE",
            )  # fmt: skip


def _kwargs(table: str, composite: bool) -> dict[str, bool]:
    """SQLite: ids never reused in the tables an unmerge puts rows back into by id (turns
    have been so since 0004)."""
    return {"sqlite_autoincrement": table == "turns" or (composite and table in NEVER_REUSED)}


# The highest id that an unmerge may put back into each table (revision 0006's merges
# delete the merged entity and the snippets the kept one has of the same turns).
RESTORABLE = {
    "entities": "SELECT MAX(merged_entity_id) FROM entity_merges WHERE undone_at IS NULL",
    "contexts": "SELECT MAX(json_extract(dropped.value, '$.id')) FROM entity_merges, "
    "json_each(entity_merges.record, '$.dropped_contexts') AS dropped "
    "WHERE entity_merges.undone_at IS NULL",
}


def _never_reuse_restorable_ids() -> None:
    """SQLite: the rebuilt tables count ids on from the highest row left; start them past
    the ids an unmerge puts back, so that no new row takes one."""
    bind = op.get_bind()
    for table, query in RESTORABLE.items():
        highest = bind.exec_driver_sql(query).scalar()
        if highest is None:
            continue
        counted = bind.exec_driver_sql(
            f"SELECT seq FROM sqlite_sequence WHERE name = '{table}'"
        ).scalar()
        if counted is None:
            bind.exec_driver_sql(
                f"INSERT INTO sqlite_sequence (name, seq) VALUES ('{table}', {int(highest)})"
            )
        elif counted < highest:
            bind.exec_driver_sql(
                f"UPDATE sqlite_sequence SET seq = {int(highest)} WHERE name = '{table}'"
            )


def _sqlite(composite: bool) -> None:
    counted = _counters()
    op.execute("DROP VIEW entity_snippets")
    op.execute("DROP VIEW entity_overview")
    if composite:
        for table in REFERRED:
            kwargs = _kwargs(table, composite)
            with op.batch_alter_table(table, recreate="always", table_kwargs=kwargs) as batch:
                batch.create_unique_constraint(f"uq_{table}_session_id_id", ["session_id", "id"])
    for table in ("contexts", "extractions", "entity_aliases"):
        kwargs = _kwargs(table, composite)
        with op.batch_alter_table(table, recreate="always", table_kwargs=kwargs) as batch:
            for owner, column, referred in FOREIGN_KEYS:
                if owner != table:
                    continue
                old = _single(table, column, referred) if composite else _composite(table, referred)
                batch.drop_constraint(old, type_="foreignkey")
                if composite:
                    batch.create_foreign_key(
                        _composite(table, referred), referred, ["session_id", column],
                        ["session_id", "id"], ondelete="CASCADE",
                    )  # fmt: skip
                else:
                    batch.create_foreign_key(
                        _single(table, column, referred), referred, [column], ["id"],
                        ondelete="CASCADE",
                    )  # fmt: skip
    if composite:
        _never_reuse_restorable_ids()
    if not composite:
        for table in REFERRED:
            kwargs = _kwargs(table, composite)
            with op.batch_alter_table(table, recreate="always", table_kwargs=kwargs) as batch:
                batch.drop_constraint(f"uq_{table}_session_id_id", type_="unique")
    _count_on_from(counted)
    op.execute(ENTITY_OVERVIEW)
    op.execute(ENTITY_SNIPPETS)


def _counters() -> dict[str, int]:
    """SQLite: the highest id each AUTOINCREMENT table has given (``sqlite_sequence``)."""
    rows = op.get_bind().exec_driver_sql("SELECT name, seq FROM sqlite_sequence").fetchall()
    return {name: int(seq) for name, seq in rows if seq is not None}


def _count_on_from(counted: dict[str, int]) -> None:
    """SQLite: a table rebuilt in batch mode counts its ids on from the highest row left,
    so a deleted newest row's id would be given again; each AUTOINCREMENT table counts on
    from where it had counted before the rebuild (revision 0004's rule)."""
    bind = op.get_bind()
    for table, seq in counted.items():
        definition = bind.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).scalar()
        if definition is None or "AUTOINCREMENT" not in definition.upper():
            continue
        now = bind.exec_driver_sql(
            "SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)
        ).scalar()
        if now is None:
            bind.exec_driver_sql(
                "INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq)
            )
        elif now < seq:
            bind.exec_driver_sql("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (seq, table))


# The indexes of the foreign keys by session: (column, session_id), which the cascades'
# queries (both columns equal) find without guessing between two one-column indexes.
FK_INDEXES = (("contexts", "turn_id"), ("entity_aliases", "entity_id"))


def _keys_by_session(table: str) -> Callable[[BatchOperations], None]:
    """The batch operation that gives ``table`` its keys by session (and a foreign key's
    index by session), as the one-transaction path leaves it."""

    def alter(batch: BatchOperations) -> None:
        if table in REFERRED:
            batch.create_unique_constraint(f"uq_{table}_session_id_id", ["session_id", "id"])
        for owner, column, referred in FOREIGN_KEYS:
            if owner == table:
                batch.drop_constraint(_single(table, column, referred), type_="foreignkey")
                batch.create_foreign_key(
                    _composite(table, referred), referred, ["session_id", column],
                    ["session_id", "id"], ondelete="CASCADE",
                )  # fmt: skip
        for owner, column in FK_INDEXES:
            if owner == table:
                batch.drop_index(f"ix_{table}_{column}")
                batch.create_index(f"ix_{table}_{column}_session_id", [column, "session_id"])

    return alter


def _keyed_by_session(table: str) -> bool:
    inspector = sa.inspect(op.get_bind())
    if table in REFERRED:
        names = {unique["name"] for unique in inspector.get_unique_constraints(table)}
        return f"uq_{table}_session_id_id" in names
    keys = {key["name"] for key in inspector.get_foreign_keys(table)}
    return all(
        _composite(table, referred) in keys for owner, _, referred in FOREIGN_KEYS if owner == table
    )


def _sqlite_online() -> None:
    """SQLite, holding the write lock briefly at a time: each table rebuilt with its keys by
    session in short transactions, the referred tables first (a foreign key by session
    needs their unique ``(session_id, id)`` as soon as the table that has it is written);
    then the ids an unmerge puts back are kept from new rows. Re-run after an
    interruption, the tables rebuilt already are left as they are."""
    bind = op.get_bind()
    with sqlite_online.apart(bind) as pacing:
        for table in (*REFERRED, "contexts", "extractions", "entity_aliases"):
            if not _keyed_by_session(table):
                sqlite_online.rebuild_table(
                    bind, table, _keys_by_session(table), pacing,
                    table_kwargs=_kwargs(table, composite=True),
                )  # fmt: skip
        with sqlite_online.short_transaction(bind, pacing):
            _never_reuse_restorable_ids()


def _indexes(composite: bool) -> None:
    for table, column in FK_INDEXES:
        if composite:
            op.drop_index(f"ix_{table}_{column}", table_name=table)
            op.create_index(f"ix_{table}_{column}_session_id", table, [column, "session_id"])
        else:
            op.drop_index(f"ix_{table}_{column}_session_id", table_name=table)
            op.create_index(f"ix_{table}_{column}", table, [column])


# Set by env.py: the revision runs in transactions of its own on Postgres.
ONLINE_DDL = "online_ddl"
# The suffix of a primary key's index while it is built, before the key takes it.
BUILDING = "_building"


def _postgres_online() -> None:
    """Postgres, without holding the tables' locks for long (see the module's docstring)."""
    swapped = (
        op.get_bind()
        .exec_driver_sql(
            # The table on the search_path: another schema may hold swapped tables.
            "SELECT 1 FROM pg_constraint WHERE conname = %(name)s "
            "AND conrelid = to_regclass(%(table)s)",
            {"name": _composite(*FOREIGN_KEYS[0][::2]), "table": FOREIGN_KEYS[0][0]},
        )
        .first()
    )
    if swapped is None:
        built = [
            (f"pk_{table}{BUILDING}", table, "id, session_id", "UNIQUE ") for table in KEYED_TABLES
        ]
        built += [(f"ix_{table}_{column}_session_id", table, f"{column}, session_id", "")
                  for table, column in FK_INDEXES]  # fmt: skip
        with op.get_context().autocommit_block():
            for name, table, columns, unique in built:
                # One left invalid by an interrupted run is built again.
                op.get_bind().exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                op.get_bind().exec_driver_sql(
                    f"CREATE {unique}INDEX CONCURRENTLY {name} ON {table} ({columns})"
                )
        # Every table's lock first, in the order saves take them (the turn, its entities,
        # their snippets, its ledger row): taken table by table as the statements below
        # come to them, the swap held contexts and entities while it waited for turns,
        # which a save held while it waited for entities.
        op.execute(f"LOCK TABLE {', '.join(KEYED_TABLES)} IN ACCESS EXCLUSIVE MODE")
        for table, column, referred in FOREIGN_KEYS:
            op.drop_constraint(_single(table, column, referred), table, type_="foreignkey")
        for table in KEYED_TABLES:
            op.drop_constraint(f"pk_{table}", table, type_="primary")
            op.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} "
                f"PRIMARY KEY USING INDEX pk_{table}{BUILDING}"
            )
        for table, column, referred in FOREIGN_KEYS:
            op.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {_composite(table, referred)} "
                f"FOREIGN KEY (session_id, {column}) REFERENCES {referred} (session_id, id) "
                "ON DELETE CASCADE NOT VALID"
            )
        for table, column in FK_INDEXES:
            op.drop_index(f"ix_{table}_{column}", table_name=table)
    with op.get_context().autocommit_block():
        for table, _column, referred in FOREIGN_KEYS:
            op.get_bind().exec_driver_sql(
                f"ALTER TABLE {table} VALIDATE CONSTRAINT {_composite(table, referred)}"
            )


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite" and op.get_context().config.attributes.get(
        ONLINE_DDL
    ):
        _postgres_online()
        return
    if op.get_context().config.attributes.get(ONLINE_DDL):
        _sqlite_online()
        return
    _indexes(composite=True)
    if op.get_bind().dialect.name == "sqlite":
        _sqlite(composite=True)
    else:
        _postgres(composite=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite(composite=False)
    else:
        _postgres(composite=False)
    _indexes(composite=False)
