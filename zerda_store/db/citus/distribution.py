"""Spreading sessions over machines with Citus: which tables are distributed by
``session_id`` (co-located, so a session's rows of every table sit on one shard) and which
are reference tables (copied to every node), the catalog rules the schema must follow for
that, and ``db distribute``, which applies it.

Citus's rules, read from the Postgres catalog: every primary key and unique constraint of a
distributed table includes ``session_id``; every foreign key between distributed tables
includes it on both sides; generated ids are ``bigint``. Revision 0007 made the primary and
foreign keys follow them; :data:`KNOWN_EXCEPTIONS` is empty, and ``distribute`` refuses
while any rule is broken rather than leave a half-distributed database.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ...errors import SchemaNotCurrentError, StoreError
from ..migration import migrate
from ..migration.lock import locked_connection
from ..migration.survey import upgrade_command
from ..sharding import citus_version, distributed_tables
from ..store import StoreCore, takes_store

DISTRIBUTION_COLUMN = "session_id"
# Distributed by session, co-located with the first; parents before the tables that refer
# to them (Citus distributes a table only after the tables its foreign keys name).
DISTRIBUTED_TABLES = (
    "turns",
    "entities",
    "contexts",
    "extractions",
    "entity_aliases",
    "entity_merges",
    "session_key_rules",
    "identity_judgements",
)
# Small, read by every session (the default policy has session_id ''; the compatibility floor
# is read by every process at start): a copy on each node.
REFERENCE_TABLES = ("retention_policies", "compatibility_floor")


@dataclass(frozen=True, order=True)
class Violation:
    """One constraint or column of a distributed table that breaks one of Citus's rules."""

    table: str
    name: str
    rule: str

    def __str__(self) -> str:
        return f"{self.table}.{self.name}: {self.rule}"


PRIMARY_KEY = "primary key without session_id"
UNIQUE = "unique constraint without session_id"
FOREIGN_KEY = "foreign key between distributed tables without session_id on both sides"
NOT_BIGINT = "generated id that is not bigint"
NO_COLUMN = "no session_id column"

# What the schema breaks: nothing since revision 0007 (a test reads the catalog to hold it).
KNOWN_EXCEPTIONS: frozenset[Violation] = frozenset()

_CONSTRAINTS = sa.text(
    """
    SELECT rel.relname AS "table", c.conname AS name, c.contype AS kind,
           ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
                 JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n
                 ORDER BY k.i) AS key_columns,
           ref.relname AS referred,
           ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, i)
                 JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n
                 ORDER BY k.i) AS referred_columns
    FROM pg_constraint c
    JOIN pg_class rel ON rel.oid = c.conrelid
    LEFT JOIN pg_class ref ON ref.oid = c.confrelid
    WHERE rel.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
      AND c.contype IN ('p', 'u', 'f')
    """
)
_GENERATED = sa.text(
    """
    SELECT table_name AS "table", column_name AS name, data_type
    FROM information_schema.columns
    WHERE table_schema = current_schema()
      AND (column_default LIKE 'nextval(%' OR is_identity = 'YES')
    """
)
_SESSION_COLUMNS = sa.text(
    """
    SELECT table_name FROM information_schema.columns
    WHERE table_schema = current_schema() AND column_name = :column
    """
)


def violations(connection: Connection) -> set[Violation]:
    """What the distributed tables of the connection's current schema break of Citus's
    rules, read from pg_constraint, pg_attribute and information_schema."""
    distributed = set(DISTRIBUTED_TABLES)
    found: set[Violation] = set()
    for row in connection.execute(_CONSTRAINTS):
        if row.table not in distributed:
            continue
        if row.kind in ("p", "u") and DISTRIBUTION_COLUMN not in row.key_columns:
            found.add(Violation(row.table, row.name, PRIMARY_KEY if row.kind == "p" else UNIQUE))
        if row.kind == "f" and row.referred in distributed and not _paired(row):
            found.add(Violation(row.table, row.name, FOREIGN_KEY))
    for row in connection.execute(_GENERATED):
        if row.table in distributed and row.data_type != "bigint":
            found.add(Violation(row.table, row.name, NOT_BIGINT))
    with_column = set(
        connection.execute(_SESSION_COLUMNS, {"column": DISTRIBUTION_COLUMN}).scalars()
    )
    found |= {Violation(t, DISTRIBUTION_COLUMN, NO_COLUMN) for t in distributed - with_column}
    return found


def _paired(row: sa.Row[object]) -> bool:
    """Whether a foreign key matches session_id with session_id."""
    pairs = zip(row.key_columns, row.referred_columns, strict=True)
    return (DISTRIBUTION_COLUMN, DISTRIBUTION_COLUMN) in set(pairs)


def statements(done: frozenset[str] = frozenset()) -> list[str]:
    """The Citus calls that distribute zerda_store's tables, in the order they must run,
    but for the tables in ``done`` (distributed already)."""
    calls = [
        f"SELECT create_reference_table('{table}')"
        for table in REFERENCE_TABLES
        if table not in done
    ]
    anchor = DISTRIBUTED_TABLES[0]
    for table in DISTRIBUTED_TABLES:
        if table in done:
            continue
        colocation = "" if table == anchor else f", colocate_with => '{anchor}'"
        calls.append(
            f"SELECT create_distributed_table('{table}', '{DISTRIBUTION_COLUMN}'{colocation})"
        )
    return calls


def _as_planned(table: str) -> str:
    return "reference" if table in REFERENCE_TABLES else f"by {DISTRIBUTION_COLUMN}"


@dataclass(frozen=True)
class Plan:
    """What ``distribute`` would run, and what stops it (nothing runs while anything does)."""

    statements: list[str]
    blockers: list[str]
    # The tables distributed as planned already (a second run leaves them as they are).
    done: list[str] = field(default_factory=list)
    # The statements that (re)create and distribute the functions, run on every call, in a
    # transaction of their own after the tables' (Citus takes no function command in a
    # transaction that has distributed a table).
    functions: list[str] = field(default_factory=list)


# What makes the functions run on the shards' workers (``turns.delegated.definitions``): the
# statements, for the connection's schema. Passed in by :mod:`zerda_store.migrate`, which
# knows the memory's statements; the tables come first.
Functions = Callable[[Connection], list[str]]


@takes_store
def plan(store: StoreCore, functions: Functions | None = None) -> Plan:
    """The statements and the blockers, without changing anything. Refused (StoreError) on
    SQLite and on a database that is not at the head revision. ``functions`` adds the
    statements that (re)create and distribute the functions, run on every call."""
    if store.dialect != "postgresql":
        raise StoreError(
            "db distribute needs Postgres with the citus extension: a SQLite database "
            "cannot be distributed"
        )
    revision = migrate.require_store_database(store)
    if revision != migrate.head_revision():
        raise SchemaNotCurrentError(
            f"the schema of {store.safe_url} is at revision {revision}: run "
            f"`{upgrade_command(store)}` before distributing it"
        )
    with store.connect() as connection:
        installed = citus_version(connection)
        blockers = [] if installed else [_no_citus(store)]
        blockers += [
            f"{v} (see the README, Running on Citus)" for v in sorted(violations(connection))
        ]
        found = distributed_tables(connection) if installed else {}
        created = functions(connection) if functions is not None and installed else []
    ours = (*REFERENCE_TABLES, *DISTRIBUTED_TABLES)
    done = [table for table in ours if found.get(table) == _as_planned(table)]
    blockers += [
        f"{table} is distributed {found[table]} already, not {_as_planned(table)}: "
        "undo it (undistribute_table) first"
        for table in ours
        if table in found and table not in done
    ]
    return Plan(statements(frozenset(done)), blockers, done, created)


@takes_store
def distribute(store: StoreCore, functions: Functions | None = None) -> Plan:
    """Distribute the tables not distributed yet (one transaction, under the migrations'
    lock); the plan it ran (``done``: the tables it found distributed and left alone).
    Refused, with nothing changed, when anything blocks it: the first blocker is the
    message."""
    store.check_writable()
    found = plan(store, functions)
    if found.blockers:
        more = f" (and {len(found.blockers) - 1} more)" if len(found.blockers) > 1 else ""
        raise StoreError(f"cannot distribute: {found.blockers[0]}{more}")
    for batch in (found.statements, found.functions):
        if batch:
            with locked_connection(store) as connection:
                driver = connection.connection.driver_connection
                assert driver is not None
                for statement in batch:
                    # On the driver itself: a function's body may hold a % of its own.
                    driver.execute(statement)
    return found


def _no_citus(store: StoreCore) -> str:
    return (
        f"the citus extension is not installed in {store.safe_url}: run it on a Citus "
        "coordinator and CREATE EXTENSION citus first"
    )
