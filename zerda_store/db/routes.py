"""How a store's saves and short reads are sent: the one place that chooses their route.

A caller states *what* to write (a :class:`Save`: its session, its unit of work, and the
one statement it may be written as instead); the store's :class:`Routes` choose *how* it
is sent, from what they know of the store:

- SQLite: the unit of work (``BEGIN IMMEDIATE``, the statements, ``COMMIT``);
- Postgres: a save that may be one statement goes in one round trip, its session's lock
  and the statement in one pipeline (:mod:`execution.pipeline`); when that statement finds
  names to resolve it writes nothing and the unit of work follows. Any other save is the
  unit of work, its session's lock first;
- Postgres whose tables Citus distributes (:mod:`sharding`, read once per store): a save
  that may be one statement is one call of a function that Citus runs on the worker that
  holds the session's shard (``turns.delegated``: one hop from the coordinator; the call is
  the pipeline's only statement, outside any transaction block, as Citus delegates it),
  which takes the session's lock there; when it finds names to resolve it writes nothing
  and the unit of work follows. Any other save, and every save where ``db distribute`` has
  not made the functions, is the unit of work, every statement routed whole to the
  session's shard (inserts as ``VALUES``). A store opened with ``route_to_workers`` sends
  that call, and the recall's (a :class:`SessionsCall`), to the session's worker itself
  (:mod:`placements`), through the coordinator when that worker cannot be reached.

:meth:`Routes.save` and :meth:`Routes.asave` run the same steps in the same order: the
route chosen, the store checked writable, the one trip (if chosen), then the unit of work
(if still needed). The async save differs only in where each step runs: a one trip
whose route is known without a read is sent from the event loop (:mod:`aio.loop_writes`)
when an idle connection is at hand, everything else on a database thread, one hop.

A short read (a statement or two: a turn's recall, its idempotency key's check) goes, when
awaited, where it costs least: on SQLite it runs on the event loop itself (tens of
microseconds on a local file, less than the hand-off to a thread and back); on Postgres a
single statement is sent from the event loop (:mod:`aio.loop_reads`), anything else goes
to a database thread.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from ..errors import DatabaseUnavailableError
from .aio import loop_reads, loop_writes
from .execution.driver import Runnable
from .execution.pipeline import write_pipelined
from .execution.unit_of_work import OneStatement, SessionLock, SessionLockStatements, Transaction
from .placements import Address
from .sharding import Sharding, distributed
from .store import StoreCore

T = TypeVar("T")


class Route(enum.Enum):
    """How a save is sent."""

    ONE_TRIP = "one trip"  # Postgres: the session's lock and one statement, one pipeline
    UNIT_OF_WORK = "unit of work"  # BEGIN (IMMEDIATE on SQLite), the statements, COMMIT
    ROUTED = "routed"  # Citus: the unit of work, each statement routed to the session's shard
    DELEGATED = "delegated"  # Citus: one call run on the session's worker, which locks there


def unit_of_work_of(route: Route | None) -> Route | None:
    """The unit-of-work route a save takes instead of ``route`` when it must be written as
    its general unit of work (the one trip's and the delegated call's fallback)."""
    if route is Route.ONE_TRIP:
        return Route.UNIT_OF_WORK
    if route is Route.DELEGATED:
        return Route.ROUTED
    return route


class OneTrip(Generic[T]):
    """A save written as one statement: the statement, its values, and what its rows say,
    ``(True, value)`` once stored, ``(False, _)`` when it wrote nothing and the unit of
    work must follow. ``first``: a statement (and its values) sent before it, in a trip of
    its own, whose one row's columns join the values (Citus: the ids the coordinator's
    sequences give, for a save run on a worker). ``here``: the statement as sent straight
    to the session's worker (Citus, ``route_to_workers``: run where it is sent)."""

    __slots__ = ("first", "here", "outcome", "statement", "values")

    def __init__(
        self,
        statement: Runnable,
        values: dict[str, Any],
        outcome: Callable[[list[Any]], tuple[bool, T]],
        first: tuple[Runnable, Any] | None = None,
        here: Runnable | None = None,
    ) -> None:
        self.statement = statement
        self.values = values
        self.outcome = outcome
        self.first = first
        self.here = here


class Save(Generic[T]):
    """What a save writes: its session (whose lock it takes shared); ``unit(routed)``, its
    unit of work, built when needed (``routed``: every statement must be one Citus routes
    whole to the session's shard); and ``one_trip(delegated)``, the one statement it may be
    written as instead (None: it may not), built only where that route is taken
    (``delegated``: the call of the function Citus runs on the session's worker)."""

    __slots__ = ("one_trip", "session_id", "unit")

    def __init__(
        self,
        session_id: str,
        unit: Callable[[bool], Callable[[Transaction], T]],
        one_trip: Callable[[bool], OneTrip[T]] | None = None,
    ) -> None:
        self.session_id = session_id
        self.unit = unit
        self.one_trip = one_trip


class SessionsCall(OneStatement[T]):
    """A read that is one call of a function Citus runs on the worker that holds
    ``session_id``'s shards: a store that routes to workers sends it there itself, as
    ``here`` (run where it is sent)."""

    __slots__ = ("here", "session_id")

    def __init__(
        self,
        session_id: str,
        statement: Runnable,
        values: Any,
        then: Callable[[list[Any]], T],
        here: Runnable,
    ) -> None:
        super().__init__(statement, values, then)
        self.session_id = session_id
        self.here = here

    def sent_here(self) -> OneStatement[T]:
        """The read as sent to the session's worker."""
        return OneStatement(self.here, self.values, self.then)


class Routes:
    """A store's routes: they know its dialect and, once read, whether Citus distributes its
    tables. Cheap to make (each repository makes its own); what they learn is kept by the
    store (:class:`sharding.Sharding`), read once for all of them."""

    __slots__ = ("_postgres", "_sharding", "store")

    def __init__(self, store: StoreCore) -> None:
        self.store = store
        self._sharding = store.statements(Sharding)
        self._postgres = store.dialect == "postgresql"

    def route(self, save: Save[Any], *, may_read: bool = True) -> Route | None:
        """The route of ``save``; with ``may_read=False`` None when choosing it would need a
        read (whether Citus distributes the tables, read at a store's first save)."""
        spread = self._sharding.distributed
        if spread is None:
            if not may_read:
                return None
            spread = distributed(self.store)
        if spread:
            if save.one_trip is not None and self._sharding.delegated:
                return Route.DELEGATED
            return Route.ROUTED
        if self._postgres and save.one_trip is not None:
            return Route.ONE_TRIP
        return Route.UNIT_OF_WORK

    def routed(self) -> bool:
        """Whether every statement must be one Citus routes whole to its session's shard."""
        spread = self._sharding.distributed
        return distributed(self.store) if spread is None else spread

    def delegated(self) -> bool:
        """Whether the recall is one call of a function Citus runs on the session's worker."""
        return self.routed() and self._sharding.delegated

    # -- saves ----------------------------------------------------------------------------

    def save(self, save: Save[T]) -> T:
        """Write ``save`` by its route (see the module); each route checks the store is
        writable before it sends anything."""
        route = self.route(save)
        if route is Route.ONE_TRIP or route is Route.DELEGATED:
            self.store.check_writable()  # before the trip's own read (Citus: the ids)
            trip = self._trip(save, route)
            stored, value = self._pipelined(trip, self._worker_for(trip[1], save.session_id))
            if stored:
                return value
            route = unit_of_work_of(route)
        return self.store.write(save.unit(route is Route.ROUTED), SessionLock(save.session_id))

    async def asave(self, save: Save[T]) -> T:
        """:meth:`save`, awaited: the same steps, each where it costs least (see the module)."""
        store = self.store
        route = self.route(save, may_read=False)
        store.check_writable()  # the event loop's one trip checks nothing itself
        trip = None
        if route is Route.ONE_TRIP:
            trip = self._trip(save, route)
            steps, one_trip = trip
            rows = await loop_writes.write(store, steps, _stored(one_trip))
            if not isinstance(rows, loop_writes.NotSent):
                stored, value = one_trip.outcome(rows)
                if stored:
                    return value
                return await store.awrite(save.unit(False), SessionLock(save.session_id))
        elif route is not None and route is not Route.DELEGATED:
            routed = route is Route.ROUTED
            return await store.awrite(save.unit(routed), SessionLock(save.session_id))
        # On a database thread, one hop: the route chosen (it may read, once a store), the
        # one trip if chosen, the unit of work if still needed.
        chosen: Route | None = route

        def first(before_send: Callable[[], None]) -> tuple[bool, T]:
            nonlocal chosen
            chosen = self.route(save)
            if chosen is not Route.ONE_TRIP and chosen is not Route.DELEGATED:
                return False, None  # type: ignore[return-value]
            ready = trip or self._trip(save, chosen)  # which may read (Citus: the ids)
            address = self._worker_for(ready[1], save.session_id)  # which may read
            before_send()  # a cancellation until here stops the save
            return self._pipelined(ready, address)

        def then() -> tuple[Callable[[Transaction], T], SessionLock]:
            store.check_writable()  # as the sync save's unit of work checks it
            return save.unit(unit_of_work_of(chosen) is Route.ROUTED), SessionLock(save.session_id)

        return await store.awrite_in_one_trip(first, then)

    def _trip(self, save: Save[T], route: Route) -> tuple[list[tuple[Runnable, Any]], OneTrip[T]]:
        """``save``'s one trip: the pipeline's steps (its session's lock, then its
        statement; delegated, the call alone, which takes the lock on the worker), and the
        statement with what its rows say."""
        assert save.one_trip is not None
        delegated = route is Route.DELEGATED
        trip = save.one_trip(delegated)
        if trip.first is not None:  # a read: run again on a fresh connection if need be
            statement, values = trip.first
            row = self.store.read(OneStatement(statement, values, _one_row))
            trip.values.update(row._asdict())
        if delegated:
            return [(trip.statement, trip.values)], trip
        lock = self.store.statements(SessionLockStatements).shared
        steps = [(lock, {"session_id": save.session_id}), (trip.statement, trip.values)]
        return steps, trip

    def _worker_for(self, one_trip: OneTrip[Any], session_id: str) -> Address | None:
        """Where the store routes to workers, the worker to send a delegated call to (read
        from the coordinator if need be); else None."""
        placements = self.store.placements
        if placements is None or one_trip.here is None:
            return None
        return placements.node_of(session_id)

    def _pipelined(
        self, trip: tuple[list[tuple[Runnable, Any]], OneTrip[T]], address: Address | None
    ) -> tuple[bool, T]:
        """The one trip sent from this thread (:func:`execution.pipeline.write_pipelined`),
        to the coordinator, or as a call run where it is sent to the worker at ``address``
        (:meth:`_worker_for`): through the coordinator after all when that worker cannot be
        reached (nothing was sent)."""
        steps, one_trip = trip
        placements = self.store.placements
        if address is not None:
            assert placements is not None and one_trip.here is not None
            here = [(one_trip.here, one_trip.values)]
            try:
                stored, value = one_trip.outcome(write_pipelined(placements.worker(address), here))
            except DatabaseUnavailableError as exc:
                placements.unreachable(address, exc)
            except Exception:  # failed there (not cancelled): a worker that failed over?
                self._stale()
                raise
            else:
                if not stored:  # maybe moved away (or a name to resolve): read them again
                    placements.stale()
                return stored, value
        return one_trip.outcome(write_pipelined(self.store, steps))

    # -- short reads ----------------------------------------------------------------------

    def read(self, work: Callable[[Transaction], T]) -> T:
        """A short read; a :class:`SessionsCall`, where the store routes to workers, sent
        to the session's worker."""
        address = self._worker_of(work)
        if address is not None:
            call = cast(SessionsCall[T], work)
            try:
                return self._worker(address).read(call.sent_here())
            except DatabaseUnavailableError as exc:
                self._unreachable(address, exc)
            except Exception:  # failed there (not cancelled): a worker that failed over?
                self._stale()
                raise
        return self.store.read(work)

    async def aread(self, work: Callable[[Transaction], T]) -> T:
        """A short read, awaited, where it costs least (see the module); a
        :class:`SessionsCall`, where the store routes to workers, sent to the session's
        worker (from a database thread when where that is needs a read)."""
        store = self.store
        if not self._postgres:  # SQLite: here, on the event loop
            return store.read(work)
        placements = store.placements
        if placements is not None and isinstance(work, SessionsCall):
            known, address = placements.known(work.session_id)
            if not known:
                return await store.arun(lambda: self.read(work))
            if address is not None:
                try:
                    return await loop_reads.read(self._worker(address), work.sent_here())
                except DatabaseUnavailableError as exc:
                    self._unreachable(address, exc)
                except Exception:
                    self._stale()
                    raise
        if isinstance(work, OneStatement):
            return await loop_reads.read(store, work)
        return await store.aread(work)

    def _worker_of(self, work: object) -> Address | None:
        placements = self.store.placements
        if placements is None or not isinstance(work, SessionsCall):
            return None
        return placements.node_of(work.session_id)

    def _worker(self, address: Address) -> StoreCore:
        assert self.store.placements is not None
        return self.store.placements.worker(address)

    def _unreachable(self, address: Address, exc: BaseException) -> None:
        assert self.store.placements is not None
        self.store.placements.unreachable(address, exc)

    def _stale(self) -> None:
        """After a call failed on a worker (one that failed over, for one): read the
        placements again soon."""
        assert self.store.placements is not None
        self.store.placements.stale()


def _stored(trip: OneTrip[Any]) -> Callable[[list[Any]], bool]:
    """Whether a one trip's rows say its save is stored (for a caller cancelled meanwhile)."""
    return lambda rows: trip.outcome(rows)[0]


def _one_row(rows: list[Any]) -> Any:
    [row] = rows
    return row
