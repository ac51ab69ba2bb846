"""What ``db upgrade`` and ``db rekey`` report about the merges the key rules made, taken
from the merge log rather than from what one run saw.

A run of either command may be stopped (``kill -9``, a lost connection) after it committed
merges and before it printed them. So the report of a run is every merge of reason "key
rules" in the log that no finished run has reported (``entity_merges.reported_at`` is
NULL, revision 0013), with the sessions this run recorded; once the report is handed over
(printed, or returned to a caller of :func:`migrate.upgrade`), its merges are marked
reported. The rerun after any interruption thus prints every merge of the upgrade; a
merge may be printed twice (a kill between the printing and the marking), never not at all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ...errors import StoreError
from ..schema import entity_merges, session_key_rules
from ..sharding import distributed
from ..store import StoreCore, takes_store

logger = logging.getLogger(__name__)

KEY_RULES_REASON = "key rules"


def _has_log(connection: Connection) -> bool:
    """Whether the schema has the merge log with its ``reported_at`` (revision 0013 on)."""
    inspector = sa.inspect(connection)
    if not inspector.has_table(entity_merges.name):
        return False
    return "reported_at" in {column["name"] for column in inspector.get_columns(entity_merges.name)}


@takes_store
def unreported(store: StoreCore, this_run: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The report, by session id: this run's sessions (``session_id``, ``key_rules``,
    ``unsure``, ``rekeyed``) and those of earlier runs that stopped before reporting
    (``rekeyed`` None: that run's count was not kept), each with the merges of the log not
    reported yet (each ``merge_id``, ``kept``, ``merged``, ``undone``). Without the log's
    ``reported_at`` (a schema before 0013), this run's report as it is."""
    fans_out = distributed(store)
    with store.connect() as connection:
        if not _has_log(connection):
            return [dict(entry) for entry in this_run]
        if fans_out:
            # Every session's merges: on Citus this one read runs on every shard, by design
            # (once per run of an operator's command), whatever the connection's settings
            # say of statements that do (`citus.multi_task_query_log_level`).
            connection.exec_driver_sql("SET LOCAL citus.multi_task_query_log_level = 'off'")
        merges = _unreported_merges(connection)
        rules = _rules(connection, sorted(set(merges) - {e["session_id"] for e in this_run}))
    report = [{**entry, "merges": merges.pop(entry["session_id"], [])} for entry in this_run]
    for session_id in sorted(merges):
        report.append(
            {
                "session_id": session_id,
                "key_rules": rules.get(session_id),
                "unsure": False,
                "rekeyed": None,
                "merges": merges[session_id],
            }
        )
    return sorted(report, key=lambda entry: entry["session_id"])


def _unreported_merges(connection: Connection) -> dict[str, list[dict[str, Any]]]:
    log = entity_merges.c
    query = (
        sa.select(log.session_id, log.id, log.kept_name, log.merged_name, log.undone_at)
        .where(log.reason == KEY_RULES_REASON, log.reported_at.is_(None))
        .order_by(log.session_id, log.id)
    )
    merges: dict[str, list[dict[str, Any]]] = {}
    for row in connection.execute(query):
        merges.setdefault(row.session_id, []).append(
            {
                "merge_id": int(row.id),
                "kept": row.kept_name,
                "merged": row.merged_name,
                "undone": row.undone_at is not None,
            }
        )
    return merges


def _rules(connection: Connection, sessions: list[str]) -> dict[str, str]:
    if not sessions:
        return {}
    rules = session_key_rules.c
    query = sa.select(rules.session_id, rules.key_rules).where(rules.session_id.in_(sessions))
    return {row.session_id: row.key_rules for row in connection.execute(query)}


@takes_store
def mark_reported(store: StoreCore, report: Sequence[dict[str, Any]], at: float) -> bool:
    """Mark the report's merges reported (each by its session and id: on Citus one shard
    each); the next run leaves them out. Whether it did: a failure (the database went away
    after the report was shown) is logged, not raised, as the next run only prints those
    merges again."""
    values = [
        {"session": entry["session_id"], "merge": merge["merge_id"], "at": at}
        for entry in report
        for merge in entry["merges"]
    ]
    if not values:
        return True
    log = entity_merges.c
    update = (
        sa.update(entity_merges)
        .where(log.session_id == sa.bindparam("session"), log.id == sa.bindparam("merge"))
        .values(reported_at=sa.bindparam("at"))
    )
    try:
        with store.connect() as connection:
            if _has_log(connection):
                connection.execute(update, values)
                connection.commit()
    except (DBAPIError, StoreError) as exc:
        logger.warning(
            "the %d merges reported were not marked so (%s): the next run prints them again",
            len(values),
            store.describe(exc) if isinstance(exc, DBAPIError) else exc,
        )
        return False
    return True
