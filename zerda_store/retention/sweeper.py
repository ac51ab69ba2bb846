"""The retention sweeper: a background thread a long-running service starts and stops
explicitly, pruning every session with a policy at an interval (off by default)."""

from __future__ import annotations

import logging
import threading

from .pruning import Pruner, PruneReceipt

logger = logging.getLogger("zerda_store.pruning")


class Sweeper:
    """A daemon thread that prunes every session with a policy every ``interval``
    seconds until stopped. Errors are logged, never raised; the next round tries again."""

    def __init__(self, pruner: Pruner, interval: float) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval}")
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
        while not self._stop.is_set():
            try:
                self.last_receipt = self.pruner.prune_all()
            except Exception:
                logger.exception("the retention sweeper's prune failed; trying again later")
            self.rounds += 1
            self._stop.wait(self.interval)
