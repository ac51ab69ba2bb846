"""Importing exported records into a session: one unit of work that holds the session's
lock exclusively, so that its refuse-if-not-empty check and its writes cannot be raced by
another import, a copy or a save.

Rows are built by the same builders as a save's (:mod:`rows`); a turn whose idempotency
key the session has used is found by the insert itself (``ON CONFLICT DO NOTHING``), not by
a list of keys, so no parameter limit applies however many turns the file holds.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db.driver import compile_statement
from ..db.engine import Store
from ..db.schema import entities, turns
from ..db.sql import session_param
from ..db.unit_of_work import SessionLock, Transaction
from ..errors import SessionNotEmptyError, StoreError
from ..identity.resolution import check_key_rules
from ..identity.rules import identify
from ..identity.statements import IdentityStatements
from ..model.names import DEFAULT_KEY_RULES, KeyRules, is_held_apart
from ..turns.rows import context_row, entity_row, outcome_row, turn_row
from ..turns.statements import RowsInsert, TurnStatements


def _insert_unless_key_used(insert: Any) -> Any:
    return insert.on_conflict_do_nothing(
        index_elements=[turns.c.session_id, turns.c.idempotency_key]
    ).returning(turns.c.id, turns.c.idempotency_key)


class ImportStatements:
    def __init__(self, dialect: Dialect) -> None:
        def holds(table: sa.Table) -> Any:
            return sa.exists().where(table.c.session_id == session_param())

        self.session_exists = compile_statement(
            sa.select(sa.or_(holds(turns), holds(entities)).label("found")), dialect
        )
        self.turns = RowsInsert(dialect, turns, _insert_unless_key_used)


class Importer:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._statements = store.statements(ImportStatements)
        self._turn_statements = store.statements(TurnStatements)

    def session_exists(self, session_id: str) -> bool:
        values = {"session_id": session_id}
        rows = self.store.read(lambda t: t.run(self._statements.session_exists, values))
        return bool(rows[0].found)

    def import_session(
        self,
        session_id: str,
        records: Iterable[dict[str, Any]],
        *,
        merge: bool = False,
        key_rules: KeyRules | None = None,
    ) -> dict[str, int]:
        """Write exported records (turns, then entities, then snippets, as an export orders
        them) into a session in one transaction, mapping ids, ``IMPORT_BATCH`` rows a
        statement, so memory stays flat in the session's size. ``records`` must be
        re-iterable (a list, or an object whose ``__iter__`` starts over): a unit of work
        that meets a deadlock or a lost connection runs again from the start. Entities that
        already exist in the session (a merge) are upserted as a saved turn would be.
        Nothing is written if the session holds data and ``merge`` is false, or if a turn's
        idempotency key was used in the session before. With ``key_rules`` (the rules the
        file's keys were made with, or fold-v2 for an older file's fold-v1 keys) the
        session is recorded as keyed with them (refused if it is keyed otherwise), and
        the entities are keyed with them."""
        inserts = (
            self._statements.turns,
            self._turn_statements.entities,
            self._turn_statements.contexts,
            self._turn_statements.outcomes,
        )
        for insert in inserts:
            insert.compile_all()
        exists = self._statements.session_exists
        identity = self.store.statements(IdentityStatements)

        def work(transaction: Transaction) -> dict[str, int]:
            if not merge and transaction.run(exists, {"session_id": session_id})[0].found:
                raise SessionNotEmptyError(
                    f"session {session_id!r} already holds data: pass --merge to add to it"
                )
            if key_rules is not None:
                check_key_rules(transaction, identity, session_id, key_rules, time.time())
            writer = _SessionWriter(transaction, session_id, *inserts)
            writer.keyed(key_rules, identity)
            for kind, batch in _batches(records):
                writer.write(kind, batch)
            return writer.counts

        return self.store.write(work, SessionLock(session_id, exclusive=True))


IMPORT_BATCH = 512


def _batches(records: Iterable[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Runs of records of one kind, at most ``IMPORT_BATCH`` long."""
    kind = ""
    batch: list[dict[str, Any]] = []
    for record in records:
        if record["kind"] != kind or len(batch) == IMPORT_BATCH:
            if batch:
                yield kind, batch
            kind, batch = record["kind"], []
        batch.append(record)
    if batch:
        yield kind, batch


class _SessionWriter:
    """Writes one session's records batch by batch inside one transaction, keeping only
    the maps from the file's ids to the new ones."""

    def __init__(
        self,
        transaction: Transaction,
        session_id: str,
        turn_insert: RowsInsert,
        entity_upsert: RowsInsert,
        context_insert: RowsInsert,
        outcome_insert: RowsInsert,
    ) -> None:
        self._transaction = transaction
        self._session_id = session_id
        self._inserts = (turn_insert, entity_upsert, context_insert, outcome_insert)
        self._turn_ids: dict[int, int] = {}
        self._entity_ids: dict[int, int] = {}
        # When the file's turns were saved and its entities last seen: a snippet's creation
        # time is its turn's (a note's, its entity's last_seen), as revision 0005 backfills.
        self._turn_times: dict[int, float] = {}
        self._entity_times: dict[int, float] = {}
        self._seq: _SequenceMap | None = None
        self._rules: KeyRules | None = None
        self._identity: IdentityStatements | None = None
        self._keys: dict[str, str] = {}  # new key -> name, to find a collision
        self.counts = {"turns": 0, "entities": 0, "contexts": 0}

    def keyed(self, rules: KeyRules | None, identity: IdentityStatements) -> None:
        """Key entities and aliases with ``rules`` (None: keep the file's entity keys, key
        aliases with the default rules)."""
        self._rules = rules
        self._identity = identity

    def write(self, kind: str, batch: list[dict[str, Any]]) -> None:
        if kind == "turn":
            self._write_turns(batch)
        elif kind == "entity":
            self._write_entities(batch)
        elif kind == "context":
            self._write_contexts(batch)
        elif kind == "alias":
            self._write_aliases(batch)

    def _run(self, insert: RowsInsert, rows: list[dict[str, Any]]) -> list[Any]:
        return insert.prepare(len(rows)).run(self._transaction, rows)

    def _write_turns(self, records: list[dict[str, Any]]) -> None:
        turn_insert, _, _, outcome_insert = self._inserts
        session_id = self._session_id
        records = sorted(records, key=lambda r: r["id"])
        rows = [
            turn_row(
                session_id,
                input_text=r["input_text"],
                output_text=r["output_text"],
                entity_names=r["entity_names"],
                created_at=r["created_at"],
                idempotency_key=r["idempotency_key"],
            )
            for r in records
        ]
        inserted = self._run(turn_insert, rows)
        if len(inserted) < len(rows):
            raise StoreError(_used_key_message(session_id, records, inserted))
        # Ids grow in insertion order (see repository.insert_turns).
        new_ids = sorted(int(row.id) for row in inserted)
        mapped = dict(zip((r["id"] for r in records), new_ids, strict=True))
        self._turn_ids.update(mapped)
        self._turn_times.update((r["id"], r["created_at"]) for r in records)
        outcomes = [_outcome_row(session_id, mapped[r["id"]], r) for r in records]
        self._run(outcome_insert, outcomes)
        self.counts["turns"] += len(records)

    def _write_entities(self, records: list[dict[str, Any]]) -> None:
        if self._seq is None:
            self._seq = _SequenceMap(self._turn_ids)
        seq = self._seq
        keyed = [self._rekeyed(r) for r in records]
        rows = sorted(
            (_entity_row(self._session_id, seq, r) for r in keyed),
            key=lambda row: row["name_key"],
        )
        ids = {row.name_key: int(row.id) for row in self._run(self._inserts[1], rows)}
        self._entity_ids.update((r["id"], ids[r["name_key"]]) for r in keyed)
        self._entity_times.update((r["id"], r["last_seen"]) for r in records)
        self.counts["entities"] += len(records)

    def _rekeyed(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record keyed with the import's rules; two entities of the file that are one
        under them are refused (a file keyed by older rules)."""
        if self._rules is None or is_held_apart(record["name_key"]):
            return record
        identity = identify(record["name"], self._rules)
        other = self._keys.setdefault(identity.key, record["name"])
        if other != record["name"]:
            raise StoreError(
                f"the file's entities {other!r} and {record['name']!r} are one entity under "
                f"the {self._rules.name} key rules: merge them in the source session "
                "(zerda-store merge) and export it again; nothing was imported"
            )
        return {**record, "name_key": identity.key, "core_key": identity.core}

    def _write_aliases(self, records: list[dict[str, Any]]) -> None:
        assert self._identity is not None
        rules = self._rules or DEFAULT_KEY_RULES
        for r in records:
            identity = identify(r["alias"], rules)
            entity_id = self._entity_ids[r["entity_id"]]
            added = self._transaction.run(
                self._identity.add_alias,
                {
                    "session_id": self._session_id,
                    "entity_id": entity_id,
                    "alias_key": identity.key,
                    "core_key": identity.core,
                    "alias": r["alias"],
                    "source": r["source"],
                    "created_at": r["created_at"],
                },
            )
            self._check_alias_joined(r["alias"], identity.key, entity_id, bool(added))
        self.counts["aliases"] = self.counts.get("aliases", 0) + len(records)

    def _check_alias_joined(self, alias: str, key: str, entity_id: int, added: bool) -> None:
        """Into a session that held data (``--merge``): the alias may name none of its
        other entities, by their name or by an alias (the file itself was checked)."""
        assert self._identity is not None
        values = {"session_id": self._session_id, "key": key, "alias_key": key}
        named = self._transaction.run(self._identity.entity_by_key, values)
        held = [] if added else self._transaction.run(self._identity.alias_by_key, values)
        if named or any(row.entity_id != entity_id for row in held):
            raise StoreError(
                f"the file's alias {alias!r} names another entity of session "
                f"{self._session_id!r}: merge them there first; nothing was imported"
            )

    def _write_contexts(self, records: list[dict[str, Any]]) -> None:
        seq = self._seq or _SequenceMap(self._turn_ids)
        rows = [
            context_row(
                self._session_id,
                entity_id=self._entity_ids[r["entity_id"]],
                turn_id=self._turn_ids[r["turn_id"]] if r["turn_id"] is not None else None,
                turn_seq=seq.map(r["turn_seq"]),
                text=r["text"],
                created_at=self._snippet_time(r),
            )
            for r in sorted(records, key=lambda r: (r["turn_seq"], r["id"]))
        ]
        self._run(self._inserts[2], rows)
        self.counts["contexts"] += len(records)

    def _snippet_time(self, r: dict[str, Any]) -> float:
        if r["turn_id"] is not None:
            return self._turn_times[r["turn_id"]]
        return self._entity_times[r["entity_id"]]


def _used_key_message(session_id: str, records: list[dict[str, Any]], inserted: list[Any]) -> str:
    stored = {row.idempotency_key for row in inserted}
    keys = [r["idempotency_key"] for r in records if r["idempotency_key"] is not None]
    used = next((key for key in keys if key not in stored), None)
    if used is None:  # every key went in once: the records hold one of them twice
        used = next(key for key in keys if keys.count(key) > 1)
        return f"the records hold idempotency key {used!r} more than once; nothing was imported"
    return (
        f"session {session_id!r} already has a turn with idempotency key {used!r}: "
        "the file was imported before; nothing was imported"
    )


def _outcome_row(session_id: str, turn_id: int, r: dict[str, Any]) -> dict[str, Any]:
    return outcome_row(
        session_id,
        turn_id=turn_id,
        extractor=r["extractor"] or "unknown",
        status=r["status"] or "ok",
        error=r["error"],
        latency_ms=r["latency_ms"] or 0.0,
        entity_count=r["entity_count"] if r["entity_count"] is not None else 0,
        attempts=r["attempts"] or 1,
        updated_at=r["updated_at"] if r["updated_at"] is not None else r["created_at"],
    )


def _entity_row(session_id: str, seq: _SequenceMap, r: dict[str, Any]) -> dict[str, Any]:
    return entity_row(
        session_id,
        name_key=r["name_key"],
        core_key=r.get("core_key") or r["name_key"],
        name=r["name"],
        entity_type=r["entity_type"],
        first_seen=r["first_seen"],
        last_seen=r["last_seen"],
        first_turn_id=seq.map(r["first_turn_id"]),
        first_position=r["first_position"],
    )


class _SequenceMap:
    """Maps the source's turn sequence numbers onto the imported turns' new ids, keeping
    their order: a number maps to the new id of the newest imported turn at or before it."""

    def __init__(self, turn_ids: dict[int, int]) -> None:
        self._old = sorted(turn_ids)
        self._new = [turn_ids[old] for old in self._old]

    def map(self, old_seq: int) -> int:
        index = bisect.bisect_right(self._old, old_seq) - 1
        return self._new[index] if index >= 0 else 0
