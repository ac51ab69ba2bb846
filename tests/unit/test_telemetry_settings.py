"""Telemetry settings (docs/observability.md): session ids hashed, content opt-in."""

from __future__ import annotations

import pytest

from zerda_store.telemetry import CHILD_SPANS_ENV, CONTENT_ENV, Telemetry


def test_a_session_id_is_shown_as_a_stable_short_hash() -> None:
    first, second = Telemetry(), Telemetry()
    label = first.session_label("customer-4711@example.com")
    assert label == second.session_label("customer-4711@example.com")
    assert len(label or "") == 16 and "4711" not in (label or "")
    assert first.session_label("customer-4712@example.com") != label


def test_a_salt_changes_the_hash_and_hashing_can_be_turned_off() -> None:
    plain = Telemetry().session_label("c-1")
    assert Telemetry(salt="pepper").session_label("c-1") != plain
    assert Telemetry(hash_session_ids=False).session_label("c-1") == "c-1"


@pytest.mark.parametrize(
    ("value", "recorded"),
    [("", False), ("false", False), ("NO_CONTENT", False), ("true", True), ("SPAN_ONLY", True)],
)
def test_content_is_recorded_only_when_the_environment_opts_in(
    monkeypatch: pytest.MonkeyPatch, value: str, recorded: bool
) -> None:
    monkeypatch.setenv(CONTENT_ENV, value)
    assert Telemetry().record_content is recorded
    assert Telemetry(record_content=False).record_content is False


def test_without_a_configured_provider_there_is_no_tracer_nor_meter() -> None:
    telemetry = Telemetry()
    assert telemetry.tracer() is None
    assert telemetry.instruments() is None


def test_child_spans_come_from_the_environment_unless_given_and_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Telemetry().child_spans == "all"
    monkeypatch.setenv(CHILD_SPANS_ENV, "Failures")
    assert Telemetry().child_spans == "failures"
    assert Telemetry(child_spans="all").child_spans == "all"
    with pytest.raises(ValueError, match="child_spans"):
        Telemetry(child_spans="some")
