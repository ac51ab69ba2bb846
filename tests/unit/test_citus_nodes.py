"""The pure parts of `zerda-store db citus` (:mod:`zerda_store.db.citus.nodes`): addresses and
the progress Citus's rebalance status reports."""

from __future__ import annotations

import pytest

from zerda_store.db.citus.nodes import Progress, parse_address
from zerda_store.errors import RefusedValueError


def test_an_address_is_host_and_port_and_the_port_defaults_to_5432() -> None:
    assert parse_address("10.0.0.4:6432") == ("10.0.0.4", 6432)
    assert parse_address("worker-3") == ("worker-3", 5432)


@pytest.mark.parametrize("address", ["", ":5432", "host:port", "host:"])
def test_a_malformed_address_is_refused_in_one_line(address: str) -> None:
    with pytest.raises(RefusedValueError, match="is not HOST:PORT"):
        parse_address(address)


def test_progress_counts_the_tasks_and_keeps_the_last_error_line() -> None:
    details = {
        "task_state_counts": {"done": 2, "runnable": 1, "blocked": 3},
        "tasks": [
            {
                "state": "runnable",
                "message": "ERROR: could not connect\nCONTEXT: task",
                "retried": 2,
            }
        ],
    }
    progress = Progress.reported(7, "running", details)
    assert progress == Progress(7, "running", 2, 6, "ERROR: could not connect")
    assert str(progress) == (
        "rebalance job 7: running, 2/6 moves; last error: ERROR: could not connect"
    )


def test_a_job_without_details_has_no_moves_yet() -> None:
    assert str(Progress.reported(3, "scheduled", None)) == "rebalance job 3: scheduled, 0/0 moves"
