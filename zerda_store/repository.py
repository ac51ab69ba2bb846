"""All SQL of zerda_store. It speaks in plain values and small records.

Statements are SQLAlchemy Core built from :mod:`zerda_store.schema`. The chat-turn path
(save, bulk save, recall) takes its statements from :mod:`zerda_store.statements`,
compiled once per repository, and runs them on the driver's cursor
(:mod:`zerda_store.driver`); the rest goes through SQLAlchemy's execution. Every write runs in one transaction (:meth:`Store.run_write`,
:meth:`Store.run_driver_write`); entity upserts take their keys in sorted order so that
two turns naming the same entities cannot deadlock each other.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .driver import CoreCursor, StatementRunner
from .engine import Store
from .names import UNKNOWN_TYPE, name_key
from .records import (
    EntityRecord,
    ForgetReceipt,
    Mention,
    NewTurn,
    Outcome,
    PendingTurn,
    SessionStats,
    TurnRecord,
    turn_text,
)
from .schema import contexts, entities, extractions, turns
from .statements import ENTITY_SELECT, NEWEST_FIRST, TurnStatements

__all__ = [
    "EntityRecord",
    "ForgetReceipt",
    "Mention",
    "NewTurn",
    "Outcome",
    "PendingTurn",
    "Repository",
    "SessionStats",
    "TurnRecord",
    "turn_text",
]

PAGE_SIZE = 500


def _ledger_values(outcome: Outcome, entity_count: int, at: float) -> dict[str, Any]:
    """The ledger columns that say how an extraction went."""
    return {
        "extractor": outcome.extractor,
        "status": outcome.status,
        "error": outcome.error,
        "latency_ms": outcome.latency * 1000,
        "entity_count": entity_count,
        "updated_at": at,
    }


def _entity(row: Sequence[Any]) -> EntityRecord:
    """An entity from a row that starts with the six columns of ``ENTITY_SELECT``."""
    return EntityRecord(*row[:6])


class Repository:
    """The only place that talks to the tables."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._statements = TurnStatements(store.engine.dialect)
        self._entity_columns = sa.select(*ENTITY_SELECT)
        self._recent_contexts = (
            sa.select(contexts.c.text)
            .where(contexts.c.entity_id == sa.bindparam("entity_id"))
            .order_by(*NEWEST_FIRST)
            .limit(sa.bindparam("limit"))
        )

    def driver(self, connection: Connection) -> StatementRunner:
        """Compiled statements inside a transaction that a Core connection runs."""
        return CoreCursor(connection)

    # -- writes -------------------------------------------------------------------------

    def save_turn(self, session_id: str, turn: NewTurn) -> int | None:
        """Store one turn with its entities and snippets; None if its idempotency key was
        already used in this session."""

        def work(driver: StatementRunner) -> int | None:
            inserted = self._statements.insert_rows(
                driver, "turn", [self._turn_row(session_id, turn)]
            )
            if not inserted:
                return None
            turn_id = int(inserted[0][0])
            self._attach(driver, session_id, [(turn_id, turn)])
            self._statements.insert_rows(
                driver, "outcomes", [self._outcome_row(session_id, turn_id, turn)]
            )
            return turn_id

        return self.store.run_driver_write(work)

    def save_turns(self, session_id: str, new_turns: Sequence[NewTurn]) -> list[int]:
        """Store many turns in one transaction, as a loop of :meth:`save_turn` would."""
        if not new_turns:
            return []

        def work(driver: StatementRunner) -> list[int]:
            ids = self.insert_turns(driver, [self._turn_row(session_id, t) for t in new_turns])
            saved = list(zip(ids, new_turns, strict=True))
            self._attach(driver, session_id, saved)
            outcomes = [self._outcome_row(session_id, i, turn) for i, turn in saved]
            self._statements.insert_rows(driver, "outcomes", outcomes)
            return ids

        return self.store.run_driver_write(work)

    def insert_turns(self, driver: StatementRunner, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Insert turns; their new ids in the order of ``rows``. Ids grow in the order rows
        are inserted within a statement (SQLite AUTOINCREMENT, a Postgres identity), so
        sorted ids line up with the rows whatever order RETURNING gives them in."""
        return sorted(int(row[0]) for row in self._statements.insert_rows(driver, "turns", rows))

    @staticmethod
    def _turn_row(session_id: str, turn: NewTurn) -> dict[str, Any]:
        return {
            "session_id": session_id,
            "input_text": turn.input_text,
            "output_text": turn.output_text,
            "entity_names": [mention.name for mention in turn.mentions],
            "created_at": turn.created_at,
            "idempotency_key": turn.idempotency_key,
        }

    @staticmethod
    def _outcome_row(session_id: str, turn_id: int, turn: NewTurn) -> dict[str, Any]:
        return {
            "session_id": session_id,
            "turn_id": turn_id,
            "attempts": 1,
            **_ledger_values(turn.outcome, len(turn.mentions), turn.created_at),
        }

    def upsert_entities(
        self, driver: StatementRunner, rows: Sequence[Mapping[str, Any]]
    ) -> dict[str, int]:
        """Insert or update entities, in key order; their ids by key."""
        ordered = sorted(rows, key=lambda row: row["name_key"])
        return {key: int(i) for i, key in self._statements.insert_rows(driver, "entities", ordered)}

    def insert_contexts(self, driver: StatementRunner, rows: Sequence[Mapping[str, Any]]) -> None:
        self._statements.insert_rows(driver, "contexts", rows)

    def insert_outcomes(self, driver: StatementRunner, rows: Sequence[Mapping[str, Any]]) -> None:
        self._statements.insert_rows(driver, "outcomes", rows)

    def _attach(
        self, driver: StatementRunner, session_id: str, saved: list[tuple[int, NewTurn]]
    ) -> None:
        """Upsert the entities of saved turns (in key order) and add one snippet per mention."""
        first: dict[str, dict[str, Any]] = {}
        for turn_id, turn in saved:
            for position, mention in enumerate(turn.mentions):
                row = first.get(mention.key)
                if row is None:
                    first[mention.key] = {
                        "session_id": session_id,
                        "name_key": mention.key,
                        "name": mention.name,
                        "entity_type": mention.entity_type,
                        "first_seen": turn.created_at,
                        "last_seen": turn.created_at,
                        "first_turn_id": turn_id,
                        "first_position": position,
                    }
                    continue
                row["last_seen"] = max(row["last_seen"], turn.created_at)
                if row["entity_type"] == UNKNOWN_TYPE:
                    row["entity_type"] = mention.entity_type
        if not first:
            return
        entity_ids = self.upsert_entities(driver, list(first.values()))
        snippets = []
        for turn_id, turn in saved:
            text = turn.text
            snippets += [
                {
                    "session_id": session_id,
                    "entity_id": entity_ids[mention.key],
                    "turn_id": turn_id,
                    "turn_seq": turn_id,
                    "text": text,
                }
                for mention in turn.mentions
            ]
        self.insert_contexts(driver, snippets)

    def add_context(self, entity_id: int, text: str, at: float) -> float:
        """Add a snippet that belongs to no turn; it counts as newer than every turn so far.
        Returns the entity's ``last_seen`` afterwards."""

        def work(connection: Connection) -> float:
            entity = connection.execute(
                sa.select(entities.c.session_id, entities.c.last_seen).where(
                    entities.c.id == entity_id
                )
            ).one_or_none()
            if entity is None:
                raise LookupError("the entity no longer exists")
            newest_turn = sa.select(sa.func.coalesce(sa.func.max(turns.c.id), 0)).scalar_subquery()
            connection.execute(
                contexts.insert().values(
                    session_id=entity.session_id,
                    entity_id=entity_id,
                    turn_id=None,
                    turn_seq=newest_turn,
                    text=text,
                )
            )
            last_seen = max(entity.last_seen, at)
            connection.execute(
                entities.update().where(entities.c.id == entity_id).values(last_seen=last_seen)
            )
            return float(last_seen)

        return self.store.run_write(work)

    def clear(self, session_id: str) -> None:
        def work(connection: Connection) -> None:
            for table in (contexts, extractions, entities, turns):
                connection.execute(table.delete().where(table.c.session_id == session_id))

        self.store.run_write(work)

    def forget_entity(
        self, session_id: str, key: str, *, with_turns: bool, normalize: bool
    ) -> ForgetReceipt | None:
        """Erase one entity and its snippets in one transaction, and its name from the
        turns that mention it (or, ``with_turns``, those turns and all their snippets)."""

        def work(connection: Connection) -> ForgetReceipt | None:
            entity = self._find_entity(connection, session_id, key)
            if entity is None:
                return None
            turn_ids = list(
                connection.execute(
                    sa.select(contexts.c.turn_id)
                    .where(contexts.c.entity_id == entity.id, contexts.c.turn_id.is_not(None))
                    .distinct()
                ).scalars()
            )
            turns_deleted = turns_updated = contexts_deleted = orphans = 0
            if with_turns:
                # Turns whose extraction failed name nobody yet; a later reextract would
                # bring the entity back from them.
                turn_ids += self._failed_turns_mentioning(connection, session_id, key, normalize)
            if with_turns and turn_ids:
                contexts_deleted, orphans = self._delete_turn_snippets(
                    connection, turn_ids, entity.id
                )
                self._delete(connection, extractions, extractions.c.turn_id.in_(turn_ids))
                turns_deleted = self._delete(connection, turns, turns.c.id.in_(turn_ids))
            else:
                turns_updated = self._drop_name_from_turns(connection, turn_ids, key, normalize)
            contexts_deleted += self._delete(
                connection, contexts, contexts.c.entity_id == entity.id
            )
            self._delete(connection, entities, entities.c.id == entity.id)
            return ForgetReceipt(
                entity.name, 1 + orphans, contexts_deleted, turns_deleted, turns_updated
            )

        return self.store.run_write(work)

    @staticmethod
    def _failed_turns_mentioning(
        connection: Connection, session_id: str, key: str, normalize: bool
    ) -> list[int]:
        failed = connection.execute(
            sa.select(turns.c.id, turns.c.input_text, turns.c.output_text)
            .join(extractions, extractions.c.turn_id == turns.c.id)
            .where(extractions.c.session_id == session_id, extractions.c.status == "failed")
        )
        # The name as whole words: "Ann" is not in "annual".
        pattern = re.compile(rf"(?<!\w){re.escape(key)}(?!\w)")
        return [
            row.id
            for row in failed
            if pattern.search(name_key(f"{row.input_text} {row.output_text}", normalize=normalize))
        ]

    def _delete_turn_snippets(
        self, connection: Connection, turn_ids: list[int], forgotten_id: int
    ) -> tuple[int, int]:
        """Delete every snippet of these turns, and the other entities left with no
        snippet at all (they were known only from these turns). Returns both counts."""
        mentioned = list(
            connection.execute(
                sa.select(contexts.c.entity_id).where(contexts.c.turn_id.in_(turn_ids)).distinct()
            ).scalars()
        )
        deleted = self._delete(connection, contexts, contexts.c.turn_id.in_(turn_ids))
        has_snippets = sa.exists().where(contexts.c.entity_id == entities.c.id)
        orphans = self._delete(
            connection,
            entities,
            sa.and_(entities.c.id.in_(mentioned), entities.c.id != forgotten_id, ~has_snippets),
        )
        return deleted, orphans

    @staticmethod
    def _delete(connection: Connection, table: sa.Table, condition: Any) -> int:
        return connection.execute(table.delete().where(condition)).rowcount

    @staticmethod
    def _drop_name_from_turns(
        connection: Connection, turn_ids: list[int], key: str, normalize: bool
    ) -> int:
        if not turn_ids:
            return 0
        rows = connection.execute(
            sa.select(turns.c.id, turns.c.entity_names).where(turns.c.id.in_(turn_ids))
        ).all()
        updates = [
            {
                "turn_id": row.id,
                "names": [n for n in row.entity_names if name_key(n, normalize=normalize) != key],
            }
            for row in rows
        ]
        connection.execute(
            turns.update()
            .where(turns.c.id == sa.bindparam("turn_id"))
            .values(entity_names=sa.bindparam("names")),
            updates,
        )
        return len(updates)

    # -- reads --------------------------------------------------------------------------

    def has_turn(self, session_id: str, idempotency_key: str) -> bool:
        with self.store.read() as connection:
            found = connection.execute(
                sa.select(turns.c.id).where(
                    turns.c.session_id == session_id, turns.c.idempotency_key == idempotency_key
                )
            ).first()
        return found is not None

    def _find_entity(
        self, connection: Connection, session_id: str, key: str
    ) -> EntityRecord | None:
        row = connection.execute(
            self._entity_columns.where(
                entities.c.session_id == session_id, entities.c.name_key == key
            )
        ).one_or_none()
        return _entity(row) if row is not None else None

    def find_entity(self, session_id: str, key: str) -> EntityRecord | None:
        with self.store.read() as connection:
            return self._find_entity(connection, session_id, key)

    def recall(
        self, session_id: str, keys: Sequence[str], limit: int
    ) -> list[tuple[EntityRecord, list[str]]]:
        """The entities among ``keys`` that have snippets, in the order of ``keys``, each
        with its last ``limit`` snippets (oldest first). One statement, which sees one
        snapshot by itself, with no transaction around it (on SQLite, one per
        ``RECALL_CHUNK`` keys)."""
        unique = list(dict.fromkeys(keys))
        rows: list[Any] = []
        for statement, values in self._statements.recall_batches(session_id, unique, limit):
            rows += self._read(statement, values)
        position = {key: i for i, key in enumerate(unique)}
        # Columns: the entity's six, then the snippet's text, turn_seq and id.
        rows.sort(key=lambda row: (position[row[2]], row[7], row[8]))
        recalled: dict[str, tuple[EntityRecord, list[str]]] = {}
        for row in rows:
            entry = recalled.get(row[2])
            if entry is None:
                entry = recalled[row[2]] = (_entity(row), [])
            entry[1].append(row[6])
        return list(recalled.values())

    def _read(self, statement: Any, values: dict[str, Any]) -> list[Any]:
        return self.store.run_driver_read(lambda driver: driver.execute(statement, values))

    def _recent(self, connection: Connection, entity_id: int, limit: int | None) -> list[str]:
        if limit is None:
            query = (
                sa.select(contexts.c.text)
                .where(contexts.c.entity_id == entity_id)
                .order_by(contexts.c.turn_seq, contexts.c.id)
            )
            return list(connection.execute(query).scalars())
        newest = connection.execute(
            self._recent_contexts, {"entity_id": entity_id, "limit": limit}
        ).scalars()
        return list(newest)[::-1]

    def recent_contexts(self, entity_id: int, limit: int | None) -> list[str]:
        """The last ``limit`` snippets of an entity, oldest first (all of them for None)."""
        with self.store.read() as connection:
            return self._recent(connection, entity_id, limit)

    def entity_details(
        self, session_id: str, key: str, limit: int
    ) -> tuple[EntityRecord, int, list[str]] | None:
        """An entity, its snippet count and its last ``limit`` snippets, in one snapshot."""
        with self.store.read() as connection:
            entity = self._find_entity(connection, session_id, key)
            if entity is None:
                return None
            count = connection.execute(
                sa.select(sa.func.count()).where(contexts.c.entity_id == entity.id)
            ).scalar_one()
            return entity, int(count), self._recent(connection, entity.id, limit)

    def iter_entities(self, session_id: str) -> Iterator[EntityRecord]:
        """The session's entities in first-seen order, fetched a page at a time."""
        order = (entities.c.first_turn_id, entities.c.first_position, entities.c.id)
        after: tuple[int, int, int] | None = None
        while True:
            query = self._entity_columns.add_columns(*order[:2]).where(
                entities.c.session_id == session_id
            )
            if after is not None:
                query = query.where(sa.tuple_(*order) > sa.tuple_(*after))
            with self.store.read() as connection:
                rows = connection.execute(query.order_by(*order).limit(PAGE_SIZE)).all()
            yield from (_entity(row) for row in rows)
            if len(rows) < PAGE_SIZE:
                return
            last = rows[-1]
            after = (last.first_turn_id, last.first_position, last.id)

    def count_entities(self, session_id: str) -> int:
        return self._count(entities, session_id)

    def count_turns(self, session_id: str) -> int:
        return self._count(turns, session_id)

    def _count(self, table: sa.Table, session_id: str) -> int:
        with self.store.read() as connection:
            return int(
                connection.execute(
                    sa.select(sa.func.count())
                    .select_from(table)
                    .where(table.c.session_id == session_id)
                ).scalar_one()
            )

    def stats(self, session_id: str) -> SessionStats:
        def count(table: sa.Table) -> Any:
            return (
                sa.select(sa.func.count())
                .select_from(table)
                .where(table.c.session_id == session_id)
                .scalar_subquery()
            )

        with self.store.read() as connection:
            row = connection.execute(
                sa.select(count(entities), count(turns), count(contexts))
            ).one()
        return SessionStats(int(row[0]), int(row[1]), int(row[2]))

    _TURN_COLUMNS = (turns.c.id, turns.c.input_text, turns.c.output_text, turns.c.entity_names)

    def _turns(self, query: Any) -> list[TurnRecord]:
        with self.store.read() as connection:
            rows = connection.execute(query).all()
        return [TurnRecord(r.id, r.input_text, r.output_text, list(r.entity_names)) for r in rows]

    def turns_page(
        self, session_id: str, offset: int, limit: int, *, newest_first: bool = False
    ) -> list[TurnRecord]:
        """``limit`` turns from position ``offset``, in saved order (or counting from the
        newest turn, for negative indexes)."""
        order = turns.c.id.desc() if newest_first else turns.c.id
        query = sa.select(*self._TURN_COLUMNS).where(turns.c.session_id == session_id)
        return self._turns(query.order_by(order).offset(offset).limit(limit))

    def iter_turns(self, session_id: str) -> Iterator[TurnRecord]:
        """The session's turns in saved order, fetched a page at a time."""
        after = 0
        while True:
            page = self._turns(
                sa.select(*self._TURN_COLUMNS)
                .where(turns.c.session_id == session_id, turns.c.id > after)
                .order_by(turns.c.id)
                .limit(PAGE_SIZE)
            )
            yield from page
            if len(page) < PAGE_SIZE:
                return
            after = page[-1].id

    # -- the extraction ledger ------------------------------------------------------------

    def failed_turns(self, session_id: str | None = None) -> list[PendingTurn]:
        """Turns whose extraction failed, in turn order (of one session, or of all)."""
        query = (
            sa.select(
                turns.c.id,
                turns.c.session_id,
                turns.c.input_text,
                turns.c.output_text,
                turns.c.created_at,
            )
            .join(extractions, extractions.c.turn_id == turns.c.id)
            .where(extractions.c.status == "failed")
            .order_by(turns.c.id)
        )
        if session_id is not None:
            query = query.where(extractions.c.session_id == session_id)
        with self.store.read() as connection:
            return [PendingTurn(*row) for row in connection.execute(query)]

    def repair_turn(
        self, turn: PendingTurn, mentions: Sequence[Mention], outcome: Outcome, at: float
    ) -> bool:
        """Record a new extraction of a failed turn; if it worked, attach its entities and
        snippets in the turn's own place. False if the turn is no longer waiting (another
        process repaired it, or it was deleted)."""

        def work(connection: Connection) -> bool:
            waiting = sa.select(extractions.c.id).where(
                extractions.c.turn_id == turn.id, extractions.c.status == "failed"
            )
            if self.store.dialect == "postgresql":
                waiting = waiting.with_for_update()
            if connection.execute(waiting).first() is None:
                return False
            if outcome.status == "ok" and mentions:
                rebuilt = NewTurn(turn.input_text, turn.output_text, mentions, turn.created_at)
                self._attach(self.driver(connection), turn.session_id, [(turn.id, rebuilt)])
                connection.execute(
                    turns.update()
                    .where(turns.c.id == turn.id)
                    .values(entity_names=[mention.name for mention in mentions])
                )
            connection.execute(
                extractions.update()
                .where(extractions.c.turn_id == turn.id)
                .values(
                    attempts=extractions.c.attempts + 1,
                    **_ledger_values(outcome, len(mentions), at),
                )
            )
            return True

        return self.store.run_write(work)
