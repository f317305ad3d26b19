"""The built-in trainer's bad-step rule (`workers.engine.health`) and the `nan` fault
that tests it end to end (`workers.faults.poison`)."""

from __future__ import annotations

import math

import pytest

from workers import faults
from workers.engine.health import LossWatch


def watch_with(losses: list[float], *, factor: float | None = 3.0, window: int = 50) -> LossWatch:
    watch = LossWatch(spike_factor=factor, spike_window=window)
    for step, loss in enumerate(losses, start=1):
        assert watch.check(step, loss, 1.0) is None
    return watch


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_loss_that_is_not_finite_is_bad_from_the_first_step(value: float) -> None:
    bad = LossWatch(spike_factor=3.0, spike_window=50).check(1, value, math.nan)
    assert bad is not None
    assert str(bad) == f"step 1: loss is {value} (grad norm nan)"


def test_a_spike_is_over_the_factor_times_the_median_of_the_window() -> None:
    watch = watch_with([2.0] * 9 + [4.0])  # median 2.0 of 10 good losses
    assert watch.check(11, 6.0, 1.0) is None  # 6 = 3 x 2 is not over
    bad = watch.check(12, 6.1, 1.0)
    assert bad is not None
    assert str(bad) == "step 12: loss 6.1 spiked over 3 x median 2 (grad norm 1)"


def test_no_spike_is_called_before_the_window_holds_ten_good_losses() -> None:
    watch = watch_with([1.0] * 9)
    assert watch.check(10, 100.0, 1.0) is None  # the 10th good loss
    assert watch.check(11, 100.0, 1.0) is not None


def test_a_window_smaller_than_ten_judges_once_full_and_slides() -> None:
    watch = watch_with([1.0] * 5, window=5)
    assert watch.check(6, 3.5, 1.0) is not None
    for step in range(7, 10):  # 3 good losses of 2.0 push out three of 1.0: median 2.0
        assert watch.check(step, 2.0, 1.0) is None
    assert watch.check(10, 5.9, 1.0) is None
    assert watch.check(11, 6.1, 1.0) is not None


def test_a_bad_loss_stays_out_of_the_window_and_a_clear_empties_it() -> None:
    watch = watch_with([1.0] * 10)
    assert watch.check(11, 50.0, 1.0) is not None
    assert watch.check(12, math.nan, 1.0) is not None
    assert list(watch.good) == [1.0] * 10
    watch.clear()
    assert watch.check(13, 50.0, 1.0) is None  # nothing to compare with yet


def test_without_a_spike_factor_only_nan_and_inf_are_bad() -> None:
    watch = watch_with([1.0] * 20, factor=None)
    assert watch.check(21, 1e6, 1.0) is None
    assert watch.check(22, math.inf, 1.0) is not None


def test_the_nan_fault_poisons_only_where_asked_and_only_the_nth_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(faults, "_faults", {})
    monkeypatch.setattr(faults, "_seen", faults.Counter())
    faults.configure("engine.loss:nan@2, other:raise")
    assert [faults.poison("engine.loss") for _ in range(3)] == [False, True, False]
    assert not faults.poison("other")  # not a nan fault
    faults.inject("engine.loss")  # inject leaves nan faults alone
    faults.configure("engine.loss:nan")
    assert all(faults.poison("engine.loss") for _ in range(3))
    assert faults.parse("p:nan@3") == {"p": faults.Fault("nan", 0.0, 3)}
