"""GANGWAY_FAULTS parsing and the N-th-time rule of `workers.faults`."""

from __future__ import annotations

import pytest

from workers import faults


def test_points_actions_arguments_and_counts_are_parsed() -> None:
    parsed = faults.parse("scheduler.launched:kill@1, lease.renew:sleep=2.5,x:raise")
    assert parsed == {
        "scheduler.launched": faults.Fault("kill", 0.0, 1),
        "lease.renew": faults.Fault("sleep", 2.5, None),
        "x": faults.Fault("raise", 0.0, None),
    }
    assert faults.parse("") == {}


@pytest.mark.parametrize("text", ["nocolon", "p:explode", "p:sleep=abc", "p:kill@x"])
def test_a_malformed_entry_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        faults.parse(text)


def test_a_fault_with_a_count_fires_only_that_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_faults", faults.parse("p:raise@2"))
    monkeypatch.setattr(faults, "_seen", faults.Counter())
    faults.inject("p")
    with pytest.raises(faults.InjectedFault):
        faults.inject("p")
    faults.inject("p")
    faults.inject("unconfigured")
