"""The retention sweeper: a background thread a long-running service starts and stops
explicitly, pruning every session with a policy at an interval (off by default).

It is a feature above the store: :func:`start_sweeper` is handed the store and registers
the sweeper's stop with :meth:`Store.on_close`, so that the store never imports it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..db.store import Store, StoreCore, core_of
from .pruning import Pruner, PruneReceipt

logger = logging.getLogger("zerda_store.pruning")

# The longest interval between two rounds: a year. (A thread's wait takes at most
# threading.TIMEOUT_MAX, about 292 years; past it, the wait raised and the thread died.)
MAX_INTERVAL = 366 * 86_400.0


class Sweeper:
    """A daemon thread that prunes every session with a policy every ``interval``
    seconds until stopped. Errors are logged, never raised; the next round tries again."""

    def __init__(self, pruner: Pruner, interval: float) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(f"interval must be a number of seconds, not {type(interval).__name__}")
        if not 0 < interval <= MAX_INTERVAL:  # NaN and infinity fail here too
            raise ValueError(
                f"interval must be more than 0 and at most {MAX_INTERVAL:,.0f} seconds "
                f"(a year), got {interval}"
            )
        self.pruner = pruner
        self.interval = float(interval)
        self.rounds = 0
        self.last_receipt: PruneReceipt | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zerda-store-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to stop after its current batch's round, and wait for it."""
        self._stop.set()
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.last_receipt = self.pruner.prune_all()
                except Exception:
                    logger.exception("the retention sweeper's prune failed; trying again later")
                self.rounds += 1
                self._stop.wait(self.interval)
        except BaseException:  # never a silent end: a thread's own error goes nowhere else
            logger.exception("the retention sweeper stopped: it prunes no more")
            raise


def start_sweeper(
    store: Store | StoreCore, interval: float = 3600.0, *, now: Callable[[], float] = time.time
) -> Sweeper:
    """Start a daemon thread that prunes every session of ``store`` with a retention policy
    every ``interval`` seconds (each round in batches, like ``prune``), until
    :meth:`Sweeper.stop` or the store's :meth:`~Store.close`. Errors are logged."""
    core = core_of(store)
    sweeper = Sweeper(Pruner(core, now=now), interval)
    core.on_close(sweeper.stop)
    sweeper.start()
    return sweeper
