"""Table definitions (SQLAlchemy Core). Alembic revisions create them; nothing here runs DDL.

Every table carries ``session_id``; every unique constraint and every foreign key between
the tables includes it, and on Postgres every primary key does too (revision 0007), so the
tables can be distributed by session (Citus).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from ..model.names import MAX_NAME_LENGTH, MAX_TYPE_LENGTH

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

# A 64-bit id on Postgres; on SQLite an INTEGER PRIMARY KEY is the rowid, which is 64-bit.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

SESSION_ID_LENGTH = 255
IDEMPOTENCY_KEY_LENGTH = 255
EXTRACTOR_LENGTH = 64


class EpochNow(FunctionElement[float]):
    """Now, in epoch seconds, as each backend computes it (a column default)."""

    type = sa.Double()
    inherit_cache = True
    name = "epoch_now"


@compiles(EpochNow, "postgresql")
def _epoch_now_postgres(element: EpochNow, compiler: Any, **kw: Any) -> str:
    return "date_part('epoch', now())"


@compiles(EpochNow, "sqlite")
def _epoch_now_sqlite(element: EpochNow, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


def by_session(column: str, referred: str) -> tuple[sa.ForeignKeyConstraint]:
    """A foreign key to ``referred`` that includes the session: ``(session_id, column)``
    refers to ``(session_id, id)``, and deleting the row deletes the rows referring to it."""
    return (
        sa.ForeignKeyConstraint(
            ["session_id", column], [f"{referred}.session_id", f"{referred}.id"], ondelete="CASCADE"
        ),
    )


turns = sa.Table(
    "turns",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("input_text", sa.Text(), nullable=False),
    sa.Column("output_text", sa.Text(), nullable=False),
    # The names as extracted in this turn, one per entity, in extraction order.
    sa.Column("entity_names", sa.JSON(), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("idempotency_key", sa.String(IDEMPOTENCY_KEY_LENGTH), nullable=True),
    sa.UniqueConstraint("session_id", "idempotency_key"),
    # What the foreign keys by session refer to (on Postgres the primary key, (id, session_id),
    # serves as this pair).
    sa.UniqueConstraint("session_id", "id"),
    sa.Index(None, "session_id", "id"),
    # Turn ids order snippets and entities, so SQLite must never reuse a deleted one.
    sqlite_autoincrement=True,
)

# The condition of ``ix_entities_titled``, as the database stores it.
TITLED = sa.text("name_key <> core_key")
# The condition of ``ix_entities_first_seen``, as the database stores it: true of every
# entity (a position in a turn counts from 0).
FIRST_SEEN = sa.text("first_position >= 0")

entities = sa.Table(
    "entities",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("name_key", sa.Text(), nullable=False),
    # The key without titles and legal suffixes ("sarah chen" for "Dr. Sarah Chen"): how a
    # titled or suffixed mention finds its bare form (``identity.py``).
    # Empty (the default) for an entity the previous release saved during a rolling deploy,
    # until `zerda-store db rekey` gives it its key and core.
    sa.Column("core_key", sa.Text(), nullable=False, server_default=""),
    sa.Column("name", sa.String(MAX_NAME_LENGTH), nullable=False),
    sa.Column("entity_type", sa.String(MAX_TYPE_LENGTH), nullable=False),
    sa.Column("first_seen", sa.Double(), nullable=False),
    sa.Column("last_seen", sa.Double(), nullable=False),
    # First-seen order: the turn that first named the entity, then its place in that turn.
    sa.Column("first_turn_id", sa.BigInteger(), nullable=False),
    sa.Column("first_position", sa.Integer(), nullable=False),
    # The lookups by key, and the reads of a whole session: on Postgres the one index of
    # the table led by the session that is not partial (SQLite has ``(session_id, id)``
    # too), so that a lookup never reads the session on another (revision 0014).
    sa.UniqueConstraint("session_id", "name_key"),
    sa.UniqueConstraint("session_id", "id"),
    # First-seen order, for the reads that state its condition (``listed_first_seen``):
    # a lookup by key states none, so it never reads the session here (revision 0014).
    sa.Index(
        "ix_entities_first_seen",
        "session_id",
        "first_turn_id",
        "first_position",
        sqlite_where=FIRST_SEEN,
        postgresql_where=FIRST_SEEN,
    ),
    # Led by the core, so that it serves a lookup by core and nothing that names the
    # session alone (revision 0014).
    sa.Index(None, "core_key", "session_id"),
    # The titled or suffixed forms ("Dr. Sarah Chen": a key that is not its core), which
    # name resolution may join a mention to; a session with none of them and no alias
    # skips resolution (``identity.statements.resolution_possible``). Revision 0009.
    sa.Index("ix_entities_titled", "session_id", sqlite_where=TITLED, postgresql_where=TITLED),
    # Ids never reused: an unmerge puts rows back under their ids.
    sqlite_autoincrement=True,
)

ALIAS_SOURCE_LENGTH = 16

# Other names of an entity: added by hand (``add_alias``), the names of entities merged
# into it, and titled or suffixed forms that joined it. A mention with an alias's key
# names the alias's entity. No alias key is also an entity's key in its session.
entity_aliases = sa.Table(
    "entity_aliases",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("entity_id", Id, nullable=False),
    sa.Column("alias_key", sa.Text(), nullable=False),
    sa.Column("core_key", sa.Text(), nullable=False),
    sa.Column("alias", sa.String(MAX_NAME_LENGTH), nullable=False),
    # "manual", "merge" or "mention".
    sa.Column("source", sa.String(ALIAS_SOURCE_LENGTH), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.UniqueConstraint("session_id", "alias_key"),
    sa.Index(None, "core_key", "session_id"),
    sa.Index(None, "entity_id", "session_id"),
    *by_session("entity_id", "entities"),
    sqlite_autoincrement=True,
)

# Every merge, with what it takes to undo it: the merged entity's row, the snippets and
# aliases it moved, the snippets it dropped (one per entity per turn), and the kept
# entity's fields before and after. ``undone_at`` is set by an unmerge.
entity_merges = sa.Table(
    "entity_merges",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("kept_entity_id", sa.BigInteger(), nullable=False),
    sa.Column("merged_entity_id", sa.BigInteger(), nullable=False),
    sa.Column("kept_name", sa.String(MAX_NAME_LENGTH), nullable=False),
    sa.Column("merged_name", sa.String(MAX_NAME_LENGTH), nullable=False),
    # "manual", or "key rules" for a merge made by a re-keying migration.
    sa.Column("reason", sa.String(32), nullable=False),
    sa.Column("record", sa.JSON(), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("undone_at", sa.Double(), nullable=True),
    # When a finished `db upgrade` or `db rekey` printed it (a "key rules" merge); NULL:
    # not yet, and the next run prints it.
    sa.Column("reported_at", sa.Double(), nullable=True),
    sa.Index(None, "session_id", "id"),
)

# A person's judgement of two entities (``confirm_same``, ``reject_same``): "same" (they
# were merged: ``merge_id``) or "different" (never suggested again). The two entities'
# keys in sorted order name the pair; their names as shown when judged, for people.
identity_judgements = sa.Table(
    "identity_judgements",
    metadata,
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("key_a", sa.Text(), nullable=False),
    sa.Column("key_b", sa.Text(), nullable=False),
    sa.Column("name_a", sa.String(MAX_NAME_LENGTH), nullable=False),
    sa.Column("name_b", sa.String(MAX_NAME_LENGTH), nullable=False),
    # "same" or "different".
    sa.Column("verdict", sa.String(16), nullable=False),
    sa.Column("merge_id", sa.BigInteger(), nullable=True),
    sa.Column("decided_by", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("decided_at", sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint("session_id", "key_a", "key_b"),
)

KEY_RULES_LENGTH = 32

# The key rules each session's entities were keyed with (``names.KEY_RULES``), recorded by
# its first write: a session is never keyed two ways.
session_key_rules = sa.Table(
    "session_key_rules",
    metadata,
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), primary_key=True),
    sa.Column("key_rules", sa.String(KEY_RULES_LENGTH), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
)

# The oldest release that can still run on the schema (revision 0012): per step that set it,
# the revision a release's code must know (``db/migration/compatibility.py``). Expand steps leave it
# alone; contract steps add their row. No session_id: a reference table on Citus.
compatibility_floor = sa.Table(
    "compatibility_floor",
    metadata,
    sa.Column("raised_by", sa.String(64), primary_key=True),
    sa.Column("floor_revision", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("raised_at", sa.Double(), nullable=False),
)

contexts = sa.Table(
    "contexts",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("entity_id", Id, nullable=False),
    sa.Column("turn_id", Id, nullable=True),
    # Recency: the turn's sequence number (or, for a snippet added on its own, the newest
    # turn's at that moment), then the snippet's id. Never wall-clock time.
    sa.Column("turn_seq", sa.BigInteger(), nullable=False),
    sa.Column("text", sa.Text(), nullable=False),
    # When the snippet was stored (its turn's time; a note's own), epoch seconds: what
    # retention measures a snippet's age on. Informational otherwise, never an order.
    # The default (now) serves the previous release, which does not write it.
    sa.Column("created_at", sa.Double(), nullable=False, server_default=EpochNow()),
    # An entity's newest snippets, as every read of them names them: by session and entity,
    # read backwards and cut at the limit, whatever the statistics say (revision 0010). It
    # serves the reads of a session's snippets too.
    sa.Index(None, "session_id", "entity_id", "turn_seq", "id"),
    # The same by entity alone: the SQLite statements' and the previous release's.
    sa.Index(None, "entity_id", "turn_seq", "id"),
    # Also the index of the foreign key to turns, whose cascade asks for both columns.
    sa.Index(None, "turn_id", "session_id"),
    *by_session("entity_id", "entities"),
    *by_session("turn_id", "turns"),
    sqlite_autoincrement=True,
)

# One row per saved turn: how its extraction went. ``reextract`` retries the failed ones.
extractions = sa.Table(
    "extractions",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("turn_id", Id, nullable=False),
    sa.Column("extractor", sa.String(EXTRACTOR_LENGTH), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("latency_ms", sa.Double(), nullable=False),
    sa.Column("entity_count", sa.Integer(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.UniqueConstraint("session_id", "turn_id"),
    sa.Index(None, "status", "session_id", "turn_id"),
    sa.Index(None, "turn_id"),
    *by_session("turn_id", "turns"),
)


# The scope of the default policy, and of a rule for every entity type: the empty string,
# which no session id and no entity type can be (both are 1 or more characters long).
ANY_SCOPE = ""

# Retention rules: per session (or the default, ``session_id = ''``) and per entity type
# (or every type, ``entity_type = ''``). Durations are seconds; NULL means no limit.
retention_policies = sa.Table(
    "retention_policies",
    metadata,
    sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False),
    sa.Column("entity_type", sa.String(MAX_TYPE_LENGTH), nullable=False),
    sa.Column("keep_last", sa.Integer(), nullable=True),
    sa.Column("max_age", sa.Double(), nullable=True),
    sa.Column("session_idle", sa.Double(), nullable=True),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint("session_id", "entity_type"),
)


def in_same_session(column: Any, referred: Any) -> Any:
    """``column = referred`` between two tables (or subqueries), with their ``session_id``
    equal too: how a join or a correlation between distributed tables must read for Citus
    (on the ids alone it asks to repartition, or runs on every shard)."""
    return sa.and_(column.table.c.session_id == referred.table.c.session_id, column == referred)


def listed_first_seen() -> Any:
    """The condition a read of a session's entities in first-seen order states, so that
    ``ix_entities_first_seen`` serves it: that index's condition, as a literal (a bound
    value would not prove it)."""
    return entities.c.first_position >= sa.literal_column("0", sa.Integer)


def insert_columns(table: sa.Table) -> tuple[str, ...]:
    """The columns an insert writes: all but the generated id, in the table's order (the
    order SQLAlchemy renders VALUES in)."""
    return tuple(column.name for column in table.c if not column.primary_key)


def max_integer(column: sa.Column[object]) -> int:
    """The largest value a whole-number column takes on every backend (32 or 64 bits)."""
    return 2**63 - 1 if isinstance(column.type, sa.BigInteger) else 2**31 - 1


def max_length(column: sa.Column[object]) -> int | None:
    """The most characters a text column takes, or None for unbounded text."""
    length = getattr(column.type, "length", None)
    return int(length) if length is not None else None
