"""Writing an import's records into a session, batch by batch inside the import's one
transaction (:class:`SessionWriter`), keeping only the maps from the file's ids to the new
ones."""

from __future__ import annotations

import bisect
from typing import Any

from ..db.execution.driver import Runnable
from ..db.execution.unit_of_work import Transaction
from ..errors import StoreError
from ..identity.rules import identify
from ..identity.statements import IdentityStatements
from ..model.names import DEFAULT_KEY_RULES, KeyRules, is_held_apart
from ..turns.rows import context_row, entity_row, outcome_row, turn_row
from ..turns.statements import RowsInsert


class SessionWriter:
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
        self._merging = False
        self._same_turn: Runnable | None = None
        # Entities of the session that entities of the file joined by an alias, and the
        # turns they have a snippet of: one snippet per entity and turn, as a merge keeps.
        self._joined: set[int] = set()
        self._joined_turns: set[tuple[int, int]] = set()

    def keyed(
        self,
        rules: KeyRules | None,
        identity: IdentityStatements,
        *,
        merging: bool,
        same_turn: Runnable | None = None,
    ) -> None:
        """Key entities and aliases with ``rules`` (None: keep the file's entity keys, key
        aliases with the default rules); ``merging``: into a session that may hold data,
        where ``same_turn`` finds the file's first turn if the session holds it already."""
        self._rules = rules
        self._identity = identity
        self._merging = merging
        self._same_turn = same_turn if merging else None

    def write(self, kind: str, batch: list[dict[str, Any]]) -> None:
        if kind == "turn":
            self._write_turns(batch)
        elif kind == "entity":
            self._write_entities(batch)
        elif kind == "context":
            self._write_contexts(batch)
        elif kind == "alias":
            self._write_aliases(batch)
        elif kind == "judgement":
            self._write_judgements(batch)

    def _run(self, insert: RowsInsert, rows: list[dict[str, Any]]) -> list[Any]:
        return insert.prepare(len(rows)).run(self._transaction, rows)

    def _write_turns(self, records: list[dict[str, Any]]) -> None:
        turn_insert, _, _, outcome_insert = self._inserts
        session_id = self._session_id
        records = sorted(records, key=lambda r: r["id"])
        if self._same_turn is not None:
            self._refuse_repeat(records[0])
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

    def _refuse_repeat(self, first: dict[str, Any]) -> None:
        """A merge whose first turn the session holds (saved at the same time, with the
        same texts) is refused: the file, or another export of the same turns, was merged
        before, and a second merge would hold every turn twice."""
        statement = self._same_turn
        assert statement is not None
        self._same_turn = None
        values = {
            "session_id": self._session_id,
            "created_at": first["created_at"],
            "input_text": first["input_text"],
            "output_text": first["output_text"],
        }
        if self._transaction.run(statement, values):
            raise StoreError(
                f"session {self._session_id!r} already holds the file's first turn (saved "
                "at the same time, with the same texts): the file was merged before; "
                "nothing was imported"
            )

    def _write_entities(self, records: list[dict[str, Any]]) -> None:
        if self._seq is None:
            self._seq = _SequenceMap(self._turn_ids)
        seq = self._seq
        keyed = [self._rekeyed(r) for r in records]
        joining = [self._joining(r) if self._merging else None for r in keyed]
        plain = [r for r, target in zip(keyed, joining, strict=True) if target is None]
        # Those that join an entity by its alias go one a statement: two of them may join
        # one entity, and one upsert may not update a row twice.
        joined = [[target] for target in joining if target is not None]
        for batch in [plain, *joined] if plain else joined:
            rows = sorted(
                (_entity_row(self._session_id, seq, r) for r in batch),
                key=lambda row: row["name_key"],
            )
            ids = {row.name_key: int(row.id) for row in self._run(self._inserts[1], rows)}
            self._entity_ids.update((r["id"], ids[r["name_key"]]) for r in batch)
        self._joined.update(self._entity_ids[t["id"]] for t in joining if t is not None)
        self._entity_times.update((r["id"], r["last_seen"]) for r in records)
        self.counts["entities"] += len(records)

    def _joining(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Into a session that held data (``--merge``): an entity of the file whose key is
        an alias of the session joins the entity the alias names, as a saved turn naming
        it would; the record as that entity's (None if its key is no alias)."""
        assert self._identity is not None
        values = {"session_id": self._session_id, "alias_key": record["name_key"]}
        alias = self._transaction.run(self._identity.alias_by_key, values)
        if not alias:
            return None
        values = {"session_id": self._session_id, "entity_id": alias[0].entity_id}
        entity = self._transaction.run(self._identity.entity_by_id, values)[0]
        named = {"name": entity.name, "name_key": entity.name_key, "core_key": entity.core_key}
        return {**record, **named}

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

    def _write_judgements(self, records: list[dict[str, Any]]) -> None:
        """Each judgement under the keys the import gives its names (a confirmation's
        merge is not in this database: it comes without one); one judgement per pair,
        the file's replacing one the session held."""
        assert self._identity is not None
        for r in records:
            sides = sorted(
                (self._judged_key(r[f"key_{side}"], r[f"name_{side}"]), r[f"name_{side}"])
                for side in ("a", "b")
            )
            (key_a, name_a), (key_b, name_b) = sides
            self._transaction.count(
                self._identity.judge,
                {
                    "session_id": self._session_id,
                    "key_a": key_a,
                    "key_b": key_b,
                    "name_a": name_a,
                    "name_b": name_b,
                    "verdict": r["verdict"],
                    "merge_id": None,
                    "decided_by": r["decided_by"],
                    "decided_at": r["decided_at"],
                },
            )
        self.counts["judgements"] = self.counts.get("judgements", 0) + len(records)

    def _judged_key(self, key: str, name: str) -> str:
        if self._rules is None or is_held_apart(key):
            return key
        return self._rules.key(name) or key

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
        if self._joined:
            rows = [row for row in rows if self._first_of_turn(row)]
        if rows:
            self._run(self._inserts[2], rows)
        self.counts["contexts"] += len(rows)

    def _first_of_turn(self, row: dict[str, Any]) -> bool:
        """False for a second snippet of one turn on an entity that two entities of the
        file joined."""
        if row["entity_id"] not in self._joined or row["turn_id"] is None:
            return True
        pair = (row["entity_id"], row["turn_id"])
        if pair in self._joined_turns:
            return False
        self._joined_turns.add(pair)
        return True

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
