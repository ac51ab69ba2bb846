"""The steps of `db upgrade` and `db contract` that take tables' locks give way and run again
after a lock wait ran out or a deadlock was broken (SQLSTATE 40P01, which Citus also reports
for a distributed deadlock); any other failure is reported at once."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from zerda_store import Store
from zerda_store.db.migration import lock_waits

pytestmark = pytest.mark.postgres


def test_a_deadlock_is_tried_again_as_a_lock_timeout_is(
    monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    """The server's deadlock error (SQLSTATE 40P01, as Citus reports a distributed one) makes
    the step run again."""
    monkeypatch.setattr(lock_waits, "RETRY_PAUSES", (0.01,))
    tries = []
    with Store(postgres_url) as store, store.engine.connect() as connection:

        def run() -> None:
            tries.append(1)
            if len(tries) == 1:
                connection.exec_driver_sql(
                    "DO $$ BEGIN RAISE EXCEPTION 'canceling the transaction since it was "
                    "involved in a distributed deadlock' USING ERRCODE = '40P01'; END $$"
                )

        lock_waits.retrying_lock_timeouts(connection, run, lambda: "a test")
    assert len(tries) == 2


def test_another_error_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    monkeypatch.setattr(lock_waits, "RETRY_PAUSES", (0.01,))
    with Store(postgres_url) as store, store.engine.connect() as connection:

        def run() -> None:
            connection.exec_driver_sql(
                "DO $$ BEGIN RAISE EXCEPTION 'no' USING ERRCODE = '40001'; END $$"
            )

        with pytest.raises(OperationalError):
            lock_waits.retrying_lock_timeouts(connection, run, lambda: "a test")
