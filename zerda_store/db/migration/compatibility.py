"""Whether this release can run on a schema a newer release migrated: the compatibility floor.

Since revision 0012 the schema records the oldest release that can still run on it: one row
of ``compatibility_floor`` per step that set the floor (a revision, or ``db contract``),
naming the revision a release's code must know to run on what the step left. Expand steps
(new tables, nullable columns, indexes) add no row, so a process of release N starts on a
schema that release N+1 expanded, though it does not know its revision; a contract step
(dropping or changing what older releases use) adds its row, and from then on the
processes that do not know its floor refuse to start, saying which step raised it and what
to do. Rows are only added (a downgrade of the step deletes its own): the floor is the
newest of them, and a process knows every row's revision exactly when it knows that one.

A schema behind this release's head is not this module's business: :func:`migrate.ensure_schema`
asks for ``db upgrade`` as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ...errors import SchemaNotCurrentError
from ..execution.failures import database_error
from ..schema import compatibility_floor
from ..store import StoreCore
from .survey import Survey, unknown_revision_error

logger = logging.getLogger(__name__)

# The step `zerda-store db contract` records, and the revision its code must know: what it
# drops is written by every release from revision 0006 on.
CONTRACT_STEP = "db contract"
CONTRACT_FLOOR = "0006"
CONTRACT_REASON = (
    "dropped the defaults of contexts.created_at and entities.core_key that releases "
    "before revision 0006 need"
)


@dataclass(frozen=True)
class FloorStep:
    """One step that set the floor: a revision id or a command (``db contract``)."""

    raised_by: str
    floor_revision: str
    reason: str

    def describe(self) -> str:
        """The step as an operator knows it: ``revision 0014``, ``zerda-store db contract``."""
        if " " in self.raised_by:
            return f"`zerda-store {self.raised_by}`"
        return f"revision {self.raised_by}"


def floor_steps(connection: Connection) -> list[FloorStep] | None:
    """The steps recorded, oldest first; None for a schema without the record (before 0012)."""
    if not sa.inspect(connection).has_table(compatibility_floor.name):
        return None
    table = compatibility_floor.c
    query = sa.select(table.raised_by, table.floor_revision, table.reason).order_by(
        table.raised_at, table.raised_by
    )
    return [FloorStep(*row) for row in connection.execute(query)]


def require_runnable(store: StoreCore, found: Survey, known: frozenset[str], head: str) -> None:
    """For a zerda_store schema at a revision this version does not know: return when the
    schema says this version can run on it (a newer release's expansion), else raise the
    error that says why not and what to do. Only reads."""
    if found.elsewhere or not found.has_our_tables:
        raise unknown_revision_error(store, found)
    try:
        with store.connect() as connection:
            steps = floor_steps(connection)
    except DBAPIError as exc:
        raise database_error(store, exc) from None
    if steps is None:
        raise unknown_revision_error(store, found)
    above = [step for step in steps if step.floor_revision not in known]
    if above:
        raise below_floor_error(store, found.revision, head, above[-1])
    logger.info(
        "the schema of %s is at revision %s, which a newer release expanded; this version "
        "(revision %s) is above its compatibility floor and runs on it",
        store.location,
        found.revision,
        head,
    )


def below_floor_error(
    store: StoreCore, revision: str | None, head: str, step: FloorStep
) -> SchemaNotCurrentError:
    """The refusal of a process whose code is below the schema's compatibility floor."""
    return SchemaNotCurrentError(
        f"the zerda_store schema of {store.location} is at revision {revision}, and this "
        f"version of zerda_store (revision {head}) cannot run on it: {step.describe()} "
        f"raised its compatibility floor to revision {step.floor_revision} ({step.reason}). "
        f"Run a newer version of zerda_store on this server, one that has revision "
        f"{step.floor_revision} (the release that migrated the database, or a later one); "
        "the database was left unchanged"
    )


def newer_schema_error(
    store: StoreCore, found: Survey, known: frozenset[str], head: str
) -> SchemaNotCurrentError:
    """The refusal of a migration by a release older than the schema: what is there, and
    whether this release can still run on it."""
    try:
        require_runnable(store, found, known, head)
    except SchemaNotCurrentError as refused:
        return refused
    return SchemaNotCurrentError(
        f"the zerda_store schema of {store.location} is at revision {found.revision}, newer "
        f"than this version of zerda_store knows (its newest is {head}): a newer release "
        "expanded it. This version runs on it, but only that release (or a later one) "
        "migrates it; nothing was changed"
    )


def raise_floor(
    connection: Connection, raised_by: str, floor_revision: str, reason: str, at: float
) -> bool:
    """Record that ``raised_by`` raised the floor to ``floor_revision`` (in the caller's
    transaction); False when it was recorded already, or the schema has no record."""
    if not sa.inspect(connection).has_table(compatibility_floor.name):
        return False
    table = compatibility_floor.c
    recorded = connection.execute(
        sa.select(table.raised_by).where(table.raised_by == raised_by)
    ).first()
    if recorded is not None:
        return False
    connection.execute(
        compatibility_floor.insert().values(
            raised_by=raised_by, floor_revision=floor_revision, reason=reason, raised_at=at
        )
    )
    return True
