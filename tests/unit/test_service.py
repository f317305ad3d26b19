"""Least attained service within a priority (Tiresias' discretised 2D-LAS), preemption only
at a cheap moment, and the starvation guard."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core import PolicyConfig, Preempt, Wait, schedule
from scheduler.core.ordering import queue_order, service_band
from scheduler.model import JobState, JobView, Placement, RunInfo
from tests.unit.builders import NOW, Cluster, at, pending, running

ONE_NODE = Cluster().nodes(1, 4).snapshot()
HOUR = 3600.0


def sunk(job_id: int, *, since_checkpoint: int) -> JobView:
    """4 GPUs for 10 h: 40 GPU-hours attained, the bottom band; one step a second."""
    job = running(job_id, ["n0"] * 4, started=-10 * HOUR, step=36_000, step_time_s=1.0)
    assert job.run is not None
    return replace(job, run=replace(job.run, steps_since_checkpoint=since_checkpoint))


def test_bands_sink_at_each_level_of_attained_gpu_seconds() -> None:
    config = PolicyConfig(service_levels_gpu_s=(3600.0, 36_000.0))
    bands = [
        service_band(replace(pending(1), attained_gpu_s=used), NOW, config)
        for used in (0, 3599, 3600, 35_999, 36_000)
    ]
    assert bands == [2, 2, 1, 1, 0]
    assert service_band(sunk(1, since_checkpoint=0), NOW, config) == 0  # the current run counts
    assert service_band(pending(1), NOW, PolicyConfig(service_levels_gpu_s=())) == 0


def test_less_attained_service_goes_first_within_a_priority() -> None:
    veteran = replace(pending(1, submitted=-100), attained_gpu_s=5 * HOUR)
    newcomer = pending(2, submitted=-10)
    important = replace(pending(3, priority=1), attained_gpu_s=50 * HOUR)
    order = queue_order([veteran, newcomer, important], NOW, PolicyConfig())
    assert [j.id for j in order] == [3, 2, 1]


def test_a_sunk_job_is_preempted_for_a_newcomer_right_after_its_checkpoint() -> None:
    decisions = schedule(ONE_NODE, [sunk(1, since_checkpoint=100), pending(2, dp=4)], NOW)
    (preempt,) = [d for d in decisions if isinstance(d, Preempt)]
    assert (preempt.job_id, preempt.for_job_id) == (1, 2)
    assert "least attained service" in preempt.reason
    assert "40.0 GPU-hours" in preempt.reason


def test_no_service_preemption_that_would_throw_work_away() -> None:
    decisions = schedule(ONE_NODE, [sunk(1, since_checkpoint=1000), pending(2, dp=4)], NOW)
    assert not any(isinstance(d, Preempt) for d in decisions)
    (wait,) = decisions
    assert isinstance(wait, Wait)


def test_no_service_preemption_across_priorities_or_when_levels_are_off() -> None:
    higher = replace(sunk(1, since_checkpoint=0), priority=1)
    assert not any(
        isinstance(d, Preempt) for d in schedule(ONE_NODE, [higher, pending(2, dp=4)], NOW)
    )
    off = PolicyConfig(service_levels_gpu_s=())
    decisions = schedule(ONE_NODE, [sunk(1, since_checkpoint=0), pending(2, dp=4)], NOW, off)
    assert not any(isinstance(d, Preempt) for d in decisions)


def test_a_starved_job_is_promoted_and_its_next_run_counts_service_afresh() -> None:
    config = PolicyConfig(starvation_s=4 * HOUR)
    # Job 2 has 40 GPU-hours too, so it ranks no higher than job 1 ... until it has waited
    # 4 hours since it was last queued.
    veteran = replace(pending(2, dp=4), attained_gpu_s=40 * HOUR)
    for queued, preempts in ((-3 * HOUR, False), (-4 * HOUR, True)):
        waiting = replace(veteran, queued_at=at(queued))
        decisions = schedule(ONE_NODE, [sunk(1, since_checkpoint=0), waiting], NOW, config)
        assert any(isinstance(d, Preempt) for d in decisions) is preempts
    # Its run after 5 h of waiting: 1 GPU-hour in so far, so it is in the middle band, not
    # the bottom one its 40 earlier GPU-hours would put it in.
    promoted = replace(
        veteran,
        state=JobState.RUNNING,
        placement=Placement(("n0",) * 4),
        queued_at=at(-5 * HOUR - 900),
        run=RunInfo(started_at=at(-900), step=900, step_time_s=1.0),
    )
    assert service_band(promoted, NOW, config) == 1
    assert service_band(replace(promoted, queued_at=at(-1800)), NOW, config) == 0
