"""A database as the released version (revision 0004) left it: turns, entities and
snippets written as its ``save_context`` wrote them, keyed with fold-v1
(``normalize_names=True``) or by the names as written (``False``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from zerda_store import Store, migrate
from zerda_store.model.names import FOLD_V1

RELEASED_REVISION = "0004"


def released_database(store: Store) -> None:
    """The schema at the released version's revision."""
    migrate.upgrade(store, RELEASED_REVISION)


def save_turns(
    store: Store, session_id: str, turns: Sequence[Sequence[str]], *, exact: bool = False
) -> None:
    """One turn per list of names (as extracted), saved as the released version did: one
    entity per key (created on first mention), one snippet per entity per turn."""
    with store.connect() as connection, connection.begin():
        for names in turns:
            _save_turn(connection, session_id, names, exact)


def _save_turn(
    connection: sa.Connection, session_id: str, names: Sequence[str], exact: bool
) -> None:
    mentions: dict[str, str] = {}
    for name in names:
        mentions.setdefault(name if exact else FOLD_V1.key(name), name)
    turn_id = connection.execute(
        sa.text(
            "INSERT INTO turns (session_id, input_text, output_text, entity_names, created_at) "
            "VALUES (:session, :text, 'noted', :names, :at) RETURNING id"
        ),
        {"session": session_id, "text": " ".join(names), "names": json.dumps(list(mentions.values())),
         "at": 1_700_000_000.0},
    ).scalar_one()  # fmt: skip
    for position, (key, name) in enumerate(mentions.items()):
        entity_id = _entity(connection, session_id, key, name, turn_id, position)
        connection.execute(
            sa.text(
                "INSERT INTO contexts (session_id, entity_id, turn_id, turn_seq, text) "
                "VALUES (:session, :entity, :turn, :turn, :text)"
            ),
            {"session": session_id, "entity": entity_id, "turn": turn_id,
             "text": f"turn {turn_id} about {name}"},
        )  # fmt: skip


def _entity(
    connection: sa.Connection, session_id: str, key: str, name: str, turn_id: int, position: int
) -> int:
    found = connection.execute(
        sa.text("SELECT id FROM entities WHERE session_id = :session AND name_key = :key"),
        {"session": session_id, "key": key},
    ).scalar()
    if found is not None:
        return int(found)
    return int(
        connection.execute(
            sa.text(
                "INSERT INTO entities (session_id, name_key, name, entity_type, first_seen, "
                "last_seen, first_turn_id, first_position) VALUES (:session, :key, :name, "
                "'unknown', :at, :at, :turn, :position) RETURNING id"
            ),
            {"session": session_id, "key": key, "name": name, "at": 1_700_000_000.0 + turn_id,
             "turn": turn_id, "position": position},
        ).scalar_one()
    )  # fmt: skip


def rows(store: Store, query: str, **params: Any) -> list[tuple[Any, ...]]:
    with store.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(query), params)]
