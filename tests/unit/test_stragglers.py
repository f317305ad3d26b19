"""Straggler flags: a rank persistently slower than the gang's median, never a blip."""

from __future__ import annotations

import pytest

from scheduler.runtime.stragglers import StragglerWatch


def feed(watch: StragglerWatch, rows: list[list[float | None]]) -> object:
    result: object = None
    for row in rows:
        result = watch.observe(1, 1, row)
    return result


def test_nothing_is_said_until_the_window_is_full() -> None:
    watch = StragglerWatch(window=5)
    assert feed(watch, [[0.1, 0.1, 0.3]] * 4) is None
    found = watch.observe(1, 1, [0.1, 0.1, 0.3])
    assert found is not None and [s.rank for s in found] == [2]
    assert found[0].ratio == pytest.approx(3.0) and found[0].local_s == 0.3


def test_one_slow_step_flags_nobody() -> None:
    watch = StragglerWatch(window=5)
    rows: list[list[float | None]] = [[0.1, 0.1, 0.1]] * 4 + [[0.1, 0.9, 0.1]]
    assert feed(watch, rows) == ()


def test_a_rank_just_under_the_factor_is_not_flagged() -> None:
    watch = StragglerWatch(factor=1.5, window=3)
    assert feed(watch, [[0.1, 0.1, 0.149, 0.1]] * 3) == ()


def test_a_rank_that_reports_no_time_suspends_judgement() -> None:
    watch = StragglerWatch(window=3)
    assert feed(watch, [[0.1, None]] * 5) is None
    assert feed(watch, [[0.1]] * 5) is None  # one rank has no peers


def test_a_new_attempt_starts_over_and_gone_jobs_are_forgotten() -> None:
    watch = StragglerWatch(window=3)
    feed(watch, [[0.1, 0.5]] * 3)
    assert watch.observe(1, 2, [0.1, 0.5]) is None  # attempt 2: a fresh window
    watch.keep_only(set())
    assert watch.observe(1, 1, [0.1, 0.5]) is None
