"""The schema's operations: the public face of ``zerda-store db …``, as ``alembic.command``
is Alembic's. Upgrade and downgrade, what a database holds, the contract step, re-keying,
least-privilege roles and, on Citus, distribution and the cluster's workers::

    from zerda_store import Store, migrate

    with Store(url) as store:
        migrate.upgrade(store)

Each operation takes a :class:`~zerda_store.Store`; the command line calls these and nothing
below them.
"""

from __future__ import annotations

from .db.citus import distribution
from .db.citus import nodes as cluster
from .db.migration.drift import describe as describe_differences
from .db.migration.lock import locked_connection
from .db.migration.merge_report import mark_reported as mark_merges_reported
from .db.migration.merge_report import unreported as unreported_merges
from .db.migration.migrate import (
    acknowledge_report,
    alembic_config,
    check,
    contract,
    current_revision,
    downgrade,
    downgrade_steps,
    ensure_schema,
    head_revision,
    known_revisions,
    migrations_dir,
    prepare_for_new_data,
    require_store_database,
    upgrade,
)
from .db.migration.roles import grant
from .db.migration.roles import plan as grant_plan
from .db.migration.survey import Survey, survey, upgrade_command
from .db.store import Store
from .identity.rekeying import Rekeying, SessionRekeyed
from .turns.delegated import definitions

__all__ = [
    "Rekeying",
    "SessionRekeyed",
    "Survey",
    "acknowledge_report",
    "alembic_config",
    "check",
    "cluster",
    "contract",
    "current_revision",
    "describe_differences",
    "distribute",
    "distribution_plan",
    "downgrade",
    "downgrade_steps",
    "ensure_schema",
    "grant",
    "grant_plan",
    "head_revision",
    "known_revisions",
    "locked_connection",
    "mark_merges_reported",
    "migrations_dir",
    "prepare_for_new_data",
    "require_store_database",
    "survey",
    "unreported_merges",
    "upgrade",
    "upgrade_command",
]


def distribution_plan(store: Store) -> distribution.Plan:
    """What ``db distribute`` would run on ``store``, and what stops it (nothing changed)."""
    return distribution.plan(store, definitions)


def distribute(store: Store) -> distribution.Plan:
    """Distribute the tables by session (co-located), the small ones as reference tables,
    and (again on every run) create the functions Citus runs on the shards' workers
    (:mod:`turns.delegated`). See :func:`db.citus.distribution.distribute`."""
    return distribution.distribute(store, definitions)
