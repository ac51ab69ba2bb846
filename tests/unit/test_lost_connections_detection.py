"""A driver connection that reports itself broken counts as lost, whatever the message."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.doubles import DisconnectMessageDialect
from zerda_store.db.execution.failures import is_connection_lost


@pytest.mark.parametrize(
    ("message", "state", "lost"),
    [
        ("server closed the connection unexpectedly", {}, True),
        ("connection socket closed", {"broken": True}, True),
        ("connection socket closed", {"closed": True}, True),
        ("duplicate key value violates unique constraint", {"broken": False}, False),
        ("database is locked", {}, False),  # sqlite3 connections have neither attribute
    ],
)
def test_a_connection_is_lost_by_message_or_by_its_own_state(message, state, lost):
    connection = SimpleNamespace(**state)
    assert (
        is_connection_lost(DisconnectMessageDialect(), Exception(message), connection, None) is lost
    )
