"""Postgres: the one-statement save resolves names as the general unit of work does.

The same random conversations (bare names, titles, legal forms, names that join others,
several names of one entity in a turn) are saved once with the one-statement save and
once with every save on the general unit of work; the entities, their aliases, snippets
and recalls must come out the same.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.routes import Route, Routes, unit_of_work_of

pytestmark = pytest.mark.postgres

NAMES = [
    *["Sarah Chen", "Dr. Sarah Chen", "Omar Haddad", "Mr. Omar Haddad", "Lina Nasser"],
    *["Dr. Lina Nasser", "Acme Corp", "Acme Inc.", "Acme", "Globex Ltd", "Globex"],
]
TURNS = 40
COMPARED = ("name", "type", "contexts_count", "recent_contexts", "aliases")


class ListedNames:
    """Extracts the names a turn lists after ``names:``, separated by ``|``."""

    name = "listed-names"

    def extract(self, text: str) -> list[str]:
        listed = text.split("names:", 1)[1].split(".", 1)[0]
        return [name for name in listed.split("|") if name]


def _conversation(seed: int) -> list[str]:
    chosen = random.Random(seed)
    return [
        f"[{n}] names:{'|'.join(chosen.sample(NAMES, chosen.randint(1, 3)))}. ok"
        for n in range(TURNS)
    ]


def _outcome(store: Store, session_id: str, turns: list[str]) -> dict[str, Any]:
    memory = ConversationEntityMemory(
        extractor=ListedNames(), store=store, session_id=session_id, auto_migrate=True
    )
    for text in turns:
        memory.save_context({"input": text}, {"output": "saved"})
    infos = {}
    for name in memory.list_entities():
        info = memory.get_entity_info(name)
        assert info is not None
        infos[name] = {key: info[key] for key in COMPARED}
    recalls = [
        memory.load_memory_variables({"input": f"names:{name}. ?"})["entity_info"] for name in NAMES
    ]
    return {"entities": memory.list_entities(), "infos": infos, "recalls": recalls}


@pytest.mark.parametrize("seed", range(6))
def test_the_one_statement_save_resolves_as_the_general_one(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    turns = _conversation(seed)
    saved_in_one_trip = 0
    one_trip, route = Routes._pipelined, Routes.route

    def counted(self: Routes, *args: Any) -> tuple[bool, Any]:
        nonlocal saved_in_one_trip
        done = one_trip(self, *args)
        saved_in_one_trip += done[0]
        return done

    def never_one_trip(self: Routes, *args: Any, **options: Any) -> Route | None:
        chosen = route(self, *args, **options)
        return unit_of_work_of(chosen)

    with Store(postgres_url) as store:
        monkeypatch.setattr(Routes, "_pipelined", counted)
        single = _outcome(store, "single", turns)
        monkeypatch.setattr(Routes, "route", never_one_trip)
        general = _outcome(store, "general", turns)

    assert single == general
    assert TURNS // 4 <= saved_in_one_trip < TURNS  # both ways were taken
