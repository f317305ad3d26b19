"""Least attained service within a priority (Tiresias' discretised 2D-LAS), preemption only
at a cheap moment, and the starvation guard."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core import Admit, PolicyConfig, Preempt, Wait, schedule
from scheduler.core.ordering import queue_order, service_band
from scheduler.model import JobState, JobView, Placement, RunInfo
from tests.unit.builders import NOW, Cluster, at, pending, running

ONE_NODE = Cluster().nodes(1, 4).snapshot()
HOUR = 3600.0


def sunk(job_id: int, *, since_checkpoint: int, on: list[str] | None = None) -> JobView:
    """A gang run for 10 h (4 GPUs on n0 unless `on` places it: 40 GPU-hours attained),
    the bottom band; one step a second."""
    placement = on if on is not None else ["n0"] * 4
    job = running(job_id, placement, started=-10 * HOUR, step=36_000, step_time_s=1.0)
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


def predicted(job: JobView, remaining_s: float) -> JobView:
    return replace(job, predicted_remaining_s=remaining_s)


def test_protection_waits_for_the_jobs_predicted_run_time_past_starvation_s() -> None:
    """Bounded by what the job costs: a job predicted to run 12 h (10 of them done) is not
    protected after 4 h queued, as it was under an absolute starvation_s, but after 12 h."""
    config = PolicyConfig(starvation_s=4 * HOUR, protect_after_runs=1.0)
    veteran = predicted(replace(pending(2, dp=4), attained_gpu_s=40 * HOUR), 2 * HOUR)
    for queued, preempts in ((-4 * HOUR, False), (-11.9 * HOUR, False), (-12 * HOUR, True)):
        waiting = replace(veteran, queued_at=at(queued))
        decisions = schedule(ONE_NODE, [sunk(1, since_checkpoint=0), waiting], NOW, config)
        assert any(isinstance(d, Preempt) for d in decisions) is preempts
    # A short job (1.1 h run, 1 minute left) is protected at starvation_s.
    short = predicted(replace(pending(3), attained_gpu_s=1.1 * HOUR), 60.0)
    assert service_band(replace(short, queued_at=at(-3.9 * HOUR)), NOW, config) == 1
    assert service_band(replace(short, queued_at=at(-4 * HOUR)), NOW, config) == 2


def test_aging_is_paced_by_the_predicted_run_time() -> None:
    """One point per max(aging_interval_s, age_per_runs x predicted run time) waited: a
    job predicted to run 5 h does not overtake a newer higher-priority job after 32
    minutes (it did when aging counted 10-minute intervals alone); a 1-minute one does,
    and so does a job nothing predicts."""
    config = PolicyConfig(aging_interval_s=600)  # age_per_runs 2.0
    new = pending(2, priority=2, submitted=-10)
    for old, overtakes in (
        (predicted(pending(1, submitted=-1900), 5 * HOUR), False),
        (predicted(pending(1, submitted=-1900), 60.0), True),
        (pending(1, submitted=-1900), True),
    ):
        order = queue_order([new, old], NOW, config)
        assert (order[0].id == 1) is overtakes


def test_protected_jobs_go_first_within_their_priority_the_longest_queued_first() -> None:
    """The reservation goes to the job that has waited longest past its bound, not to the
    shortest prediction (which ordered them before). Aging is slowed here so that all
    three share one aged priority."""
    config = PolicyConfig(starvation_s=4 * HOUR, aging_interval_s=100 * HOUR)
    longest = predicted(replace(pending(1), queued_at=at(-6 * HOUR)), 2 * HOUR)
    later = predicted(replace(pending(2), queued_at=at(-5 * HOUR)), 1 * HOUR)
    fresh = predicted(pending(3), 0.1 * HOUR)
    above = pending(4, priority=1)
    order = queue_order([fresh, later, longest, above], NOW, config)
    assert [j.id for j in order] == [4, 1, 2, 3]


def test_a_protected_jobs_decisions_say_why() -> None:
    config = PolicyConfig(starvation_s=4 * HOUR, protect_after_runs=1.0)
    veteran = predicted(replace(pending(2, dp=4), attained_gpu_s=40 * HOUR), 1 * HOUR)
    waiting = replace(veteran, queued_at=at(-33 * HOUR))  # 3.0x its predicted 11 h
    decisions = schedule(ONE_NODE, [sunk(1, since_checkpoint=0), waiting], NOW, config)
    (preempt,) = [d for d in decisions if isinstance(d, Preempt)]
    (wait,) = [d for d in decisions if isinstance(d, Wait)]
    note = "protected: waited 3.0x its predicted run time"
    assert note in preempt.reason and "job 2 is protected" in preempt.reason
    assert wait.reason.startswith(note)
    admit = schedule(Cluster().nodes(1, 4).snapshot(), [waiting], NOW, config)
    assert admit[0].reason.startswith(note)  # type: ignore[union-attr]
    assert "protected" not in schedule(ONE_NODE, [veteran], NOW, config)[0].reason  # type: ignore[union-attr]


def test_a_job_that_ran_before_holds_no_reservation_until_protected() -> None:
    """Job 2 was preempted after 40 GPU-hours; it needs the whole node, which frees in 1 h.
    Holding GPUs idle for it would undo its preemption: job 3 (as sunk, queued later)
    starts on the 2 free GPUs. Once job 2 is protected it holds the reservation, and job
    3 (no time limit: it would run past it) waits."""
    config = PolicyConfig(starvation_s=4 * HOUR, reservations=True)
    holder = running(1, ["n0"] * 2, started=-HOUR, time_limit_s=2 * HOUR)
    sunk_big = replace(pending(2, dp=4, submitted=-20 * HOUR), attained_gpu_s=40 * HOUR)
    sunk_small = replace(pending(3, dp=2, submitted=-10 * HOUR), attained_gpu_s=40 * HOUR)
    for queued, reserved in ((-HOUR, False), (-5 * HOUR, True)):
        big = replace(sunk_big, queued_at=at(queued))
        small = replace(sunk_small, queued_at=at(-0.5 * HOUR))
        decisions = schedule(ONE_NODE, [holder, big, small], NOW, config)
        (wait,) = [d for d in decisions if isinstance(d, Wait) and d.job_id == 2]
        assert wait.reserved is reserved
        assert any(isinstance(d, Admit) and d.job_id == 3 for d in decisions) is not reserved
    assert (
        "holds no reservation until protected"
        in schedule(ONE_NODE, [holder, replace(sunk_big, queued_at=at(-HOUR))], NOW, config)[
            0
        ].reason
    )  # type: ignore[union-attr]


def test_larger_gangs_first_within_a_band_then_fair_share_among_one_size() -> None:
    """The pass gives the large gang GPUs before the small jobs split them up. Size never
    crosses a band or a priority; an elastic gang counts at its dp_min; fair share orders
    gangs of one size."""
    small_earlier = pending(1, submitted=-600)
    large_later = pending(2, dp=8, submitted=-60)
    sunk_large = replace(pending(3, dp=8, submitted=-900), attained_gpu_s=2 * HOUR)
    low_large = pending(4, dp=8, priority=-1, submitted=-900)
    elastic = pending(5, dp=8, dp_min=1, submitted=-30)  # runs on 1 GPU: a small gang
    heavy_user = pending(6, dp=8, submitted=-1200, user="heavy")
    jobs = [small_earlier, large_later, sunk_large, low_large, elastic, heavy_user]
    usage = {("default", "heavy"): 100.0, ("default", "default"): 1.0}
    by_size = queue_order(jobs, NOW, PolicyConfig(larger_gangs_first=True), usage)
    assert [j.id for j in by_size] == [2, 6, 1, 5, 3, 4]
    default = queue_order(jobs, NOW, PolicyConfig(), usage)  # off: fair share, then submit
    assert [j.id for j in default] == [1, 2, 5, 6, 3, 4]


def test_smaller_victims_first_before_a_gang_just_past_its_checkpoint() -> None:
    """A 1-GPU newcomer stops one of the 1-GPU gangs (100 s lost) rather than the 4-GPU
    gang that lost nothing: stopped, that one waits for a whole node to restart."""
    gang = sunk(1, since_checkpoint=0)
    singles = [
        running(i, ["n1"], started=-11 * HOUR, step=100, step_time_s=1.0) for i in (2, 3, 4, 5)
    ]
    two_nodes = Cluster().nodes(2, 4).snapshot()
    jobs = [gang, *singles, pending(6)]

    def victims(config: PolicyConfig) -> list[int]:
        return [d.job_id for d in schedule(two_nodes, jobs, NOW, config) if isinstance(d, Preempt)]

    assert victims(PolicyConfig(smaller_victims_first=True)) == [2]  # least lost, then id
    assert victims(PolicyConfig()) == [1]  # off by default: the least work lost


def test_gangs_of_a_node_or_more_are_one_size_to_both_rules() -> None:
    """Sizes count up to the largest node: a 16-GPU and an 8-GPU gang on 8-GPU nodes wait
    alike for whole nodes, so neither rule orders them (fair share, then submit, does;
    the least work lost picks among victims); a sub-node gang still orders by size."""
    whole_later = pending(1, dp=8, submitted=-60)
    two_nodes_later = pending(2, dp=16, submitted=-30)
    whole_earlier = pending(3, dp=8, submitted=-600)
    half = pending(4, dp=4, submitted=-900)
    jobs = [whole_later, two_nodes_later, whole_earlier, half]
    config = PolicyConfig(larger_gangs_first=True)
    capped = queue_order(jobs, NOW, config, node_gpus=8)
    assert [j.id for j in capped] == [3, 1, 2, 4]
    assert [j.id for j in queue_order(jobs, NOW, config)] == [2, 3, 1, 4]  # no cap

    one_node = sunk(5, since_checkpoint=200)  # 4 GPUs on n0, 200 s lost
    two_node = sunk(6, since_checkpoint=0, on=["n1"] * 4 + ["n2"] * 4)
    three_nodes = Cluster().nodes(3, 4).snapshot()  # nodes of 4 GPUs
    decisions = schedule(
        three_nodes,
        [one_node, two_node, pending(7, dp=4)],
        NOW,
        PolicyConfig(smaller_victims_first=True),
    )
    # a node or more, both: the one that loses nothing goes, though it is the larger
    assert [d.job_id for d in decisions if isinstance(d, Preempt)] == [6]
