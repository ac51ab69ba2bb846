"""The one place that chooses how a save is sent (:mod:`zerda_store.db.routes`): its choice
for each kind of store, without a database."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from zerda_store.db.routes import OneTrip, Route, Routes, Save


def _store(dialect: str, distributed: bool | None, delegated: bool = False) -> Any:
    sharding = SimpleNamespace(distributed=distributed, delegated=delegated)
    return SimpleNamespace(dialect=dialect, statements=lambda _factory: sharding)


def _save(*, one_trip: bool) -> Save[None]:
    def unit(_routed: bool) -> Any:
        return lambda _transaction: None

    def trip(_delegated: bool) -> OneTrip[None]:
        return OneTrip(None, {}, lambda _rows: (True, None))  # type: ignore[arg-type]

    return Save("s", unit, trip if one_trip else None)


@pytest.mark.parametrize(
    ("dialect", "distributed", "delegated", "one_trip", "route"),
    [
        ("sqlite", False, False, True, Route.UNIT_OF_WORK),
        ("sqlite", False, False, False, Route.UNIT_OF_WORK),
        ("postgresql", False, False, True, Route.ONE_TRIP),
        ("postgresql", False, False, False, Route.UNIT_OF_WORK),
        ("postgresql", True, False, True, Route.ROUTED),  # distributed before the functions
        ("postgresql", True, False, False, Route.ROUTED),
        ("postgresql", True, True, True, Route.DELEGATED),
        ("postgresql", True, True, False, Route.ROUTED),  # a save of many turns
    ],
)
def test_each_store_sends_a_save_by_its_own_route(
    dialect: str, distributed: bool, delegated: bool, one_trip: bool, route: Route
) -> None:
    routes = Routes(_store(dialect, distributed, delegated))

    assert routes.route(_save(one_trip=one_trip)) is route
    assert routes.route(_save(one_trip=one_trip), may_read=False) is route


def test_a_route_that_needs_a_read_is_not_chosen_where_nothing_may_be_read() -> None:
    routes = Routes(_store("postgresql", None))  # whether Citus distributes it: not read yet

    assert routes.route(_save(one_trip=True), may_read=False) is None
