"""schedule(): ordering, aging, reservations, backfill, preemption, explanations, ETAs."""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import (
    Admit,
    Blocker,
    Decision,
    PolicyConfig,
    Preempt,
    Wait,
    queue_order,
    schedule,
)
from scheduler.core.decisions import Explanation, Resize
from scheduler.core.ordering import rank, work_lost_s
from scheduler.model import (
    ClusterSnapshot,
    GangShape,
    JobState,
    JobView,
    Node,
    Parallelism,
    Placement,
    RunInfo,
)
from tests.unit.builders import NOW, Cluster, at, pending, running

# The module, not the function that `scheduler.core.schedule` names on the package.
schedule_module = importlib.import_module("scheduler.core.schedule")
TWO_BY_FOUR = Cluster().nodes(2, 4).snapshot()
# EASY backfill behind one reservation (the default holds none: BENCHMARKS.md, issue 30).
EASY = PolicyConfig(reservations=True)
NO_PREEMPTION = PolicyConfig(preemption=False, reservations=True)


def by_id(decisions: Sequence[Decision]) -> dict[int, Decision]:
    return {d.job_id: d for d in decisions if isinstance(d, Admit | Wait)}


def admitted(decisions: Sequence[Decision]) -> list[int]:
    return [d.job_id for d in decisions if isinstance(d, Admit)]


def test_orders_by_priority_then_submit_time_then_id() -> None:
    jobs = [
        pending(3, submitted=-5),
        pending(1, submitted=-5),
        pending(2, priority=10, submitted=-1),
    ]
    decisions = schedule(Cluster().nodes(3, 1).snapshot(), jobs, NOW)
    assert admitted(decisions) == [2, 1, 3]


def test_aging_lets_an_old_job_overtake_newer_higher_priority_ones() -> None:
    config = PolicyConfig(aging_interval_s=600)
    old = pending(1, priority=0, submitted=-1900)  # waited 3 intervals: effective 3
    new = pending(2, priority=2, submitted=-10)  # effective 2
    decisions = schedule(Cluster().nodes(1, 1).snapshot(), [new, old], NOW, config)
    assert admitted(decisions) == [1]


def test_aging_never_reorders_jobs_of_one_priority_class() -> None:
    """Within one priority, waiting alone lifts no job over another: least attained
    service decides. A job that has run before (a sunk band) and has waited 3 intervals
    stays behind a newcomer of its priority."""
    config = PolicyConfig(aging_interval_s=600)
    sunk = replace(pending(1, submitted=-1900), attained_gpu_s=50_000.0)
    new = pending(2, submitted=-10)
    assert [job.id for job in queue_order([sunk, new], NOW, config)] == [2, 1]


def test_aging_lifts_a_job_only_to_a_priority_class_that_is_queued() -> None:
    """Aged 3 points, a priority-0 job ranks with the priority-2 class (the highest one
    queued that it has reached), not above it: a priority-5 job still goes first, and
    within class 2 a job of less attained service goes first."""
    config = PolicyConfig(aging_interval_s=600)
    old = replace(pending(1, submitted=-1900), attained_gpu_s=50_000.0)
    fresh = pending(2, priority=2, submitted=-10)
    urgent = pending(3, priority=5, submitted=-5)
    low = pending(4, submitted=-20)
    order = queue_order([low, old, fresh, urgent], NOW, config)
    assert [job.id for job in order] == [3, 2, 1, 4]


def test_running_jobs_hold_their_gpus() -> None:
    jobs = [running(1, ["n0"] * 3), pending(2, dp=2)]
    (wait,) = schedule(Cluster().nodes(1, 4).snapshot(), jobs, NOW)
    assert isinstance(wait, Wait)
    assert wait.explanation.blocker is Blocker.CLUSTER_FULL
    assert wait.explanation.message == "needs 2 GPUs; 1 free now"


def test_head_job_gets_a_reservation_at_the_expected_end_of_running_jobs() -> None:
    jobs = [
        running(1, ["n0"] * 4, started=-600, time_limit_s=3600),  # ends at +3000
        running(2, ["n1"] * 4, started=-600, time_limit_s=7200),  # ends at +6600
        pending(3, dp=4),
    ]
    (wait,) = schedule(TWO_BY_FOUR, jobs, NOW, EASY)
    assert isinstance(wait, Wait) and wait.reserved
    assert wait.estimated_start_at == at(3000)
    assert "job(s) 1 are expected to free GPUs" in wait.explanation.unblock


def test_without_reservations_blocked_jobs_get_estimates_and_hold_nothing() -> None:
    """The default holds no GPUs for a blocked job (greedy backfill, as 2D-LAS): a job
    behind that fits the free GPUs starts, though it runs past the blocked one's start.
    Blocked jobs are still estimated, each after the GPUs of those blocked ahead of it:
    exactly on the timeline for the first `eta_jobs`, by GPU count after them."""
    jobs = [
        running(1, ["n0"] * 4, started=-600, time_limit_s=3600),  # 4 GPUs back at +3000
        running(2, ["n1"] * 2, started=-600, time_limit_s=7200),  # 2 more at +6600
        pending(3, dp=4, priority=5),
        pending(4, dp=2),  # starts on n1's 2 free GPUs; no limit: back at +86400
        pending(5, dp=4, submitted=-30),  # after job 3's 4: needs 8 back, at +86400
        pending(6, dp=4, submitted=-20),  # needs 12: more than ever comes back
    ]
    config = PolicyConfig(preemption=False, eta_jobs=2)
    decisions = by_id(schedule(TWO_BY_FOUR, jobs, NOW, config))
    head, behind, second, beyond = (decisions[i] for i in (3, 4, 5, 6))
    assert isinstance(head, Wait) and not head.reserved and head.estimated_start_at == at(3000)
    assert "expected to start at" in head.reason and "none are held for it" in head.reason
    assert isinstance(behind, Admit)
    assert isinstance(second, Wait) and second.estimated_start_at == at(86_400)
    assert isinstance(beyond, Wait) and beyond.estimated_start_at is None

    # Past `eta_jobs` the GPU-count estimate alone: job 5 still after job 3's GPUs.
    decisions = by_id(schedule(TWO_BY_FOUR, jobs, NOW, replace(config, eta_jobs=0)))
    assert [decisions[i].estimated_start_at for i in (3, 5)] == [at(3000), at(86_400)]  # type: ignore[union-attr]


def test_backfill_off_keeps_strict_order_without_reservations_too() -> None:
    jobs = [
        running(1, ["n0"] * 4, started=-600, time_limit_s=3600),
        pending(2, dp=8, priority=5),
        pending(3, dp=1, time_limit_s=60),
    ]
    decisions = by_id(
        schedule(TWO_BY_FOUR, jobs, NOW, PolicyConfig(backfill=False, preemption=False))
    )
    later = decisions[3]
    assert isinstance(later, Wait) and "backfill is off" in later.reason
    assert later.explanation.blocking_job_id == 2
    assert later.estimated_start_at is None  # 8 + 1 GPUs: the cluster's 8 never cover both


def test_backfill_off_a_job_that_can_never_start_does_not_hold_the_queue() -> None:
    """With backfill off, jobs wait in order behind the first blocked job that can ever
    start, and are not estimated to start before it: one the alive nodes can never
    hold (16 GPUs on 8) is passed, with reservations on or off."""
    jobs = [
        running(1, ["n0"] * 4, started=-600, time_limit_s=3600),  # n0 back at +3000
        running(2, ["n1"] * 3, started=-600, time_limit_s=9000),  # 3 more at +8400
        pending(20, dp=16, priority=9),  # never fits
        pending(21, tp=4, priority=5),  # a whole node: n0 at +3000
        pending(22, dp=1),  # fits n1's free GPU now, but backfill is off
    ]
    for reservations in (False, True):
        config = PolicyConfig(backfill=False, preemption=False, reservations=reservations)
        decisions = by_id(schedule(TWO_BY_FOUR, jobs, NOW, config))
        never, head, behind = decisions[20], decisions[21], decisions[22]
        assert isinstance(never, Wait) and "cannot hold it" in never.reason
        assert isinstance(head, Wait) and head.estimated_start_at == at(3000)
        assert isinstance(behind, Wait) and behind.explanation.blocking_job_id == 21
        assert behind.estimated_start_at is not None and behind.estimated_start_at >= at(3000)


def test_a_protected_job_holds_the_reservation_without_reservations() -> None:
    """Protection bounds the wait of a large job that small ones would otherwise pass
    forever: once protected it holds its start, and a job behind that would run past it
    waits; unprotected, the same job holds nothing."""
    config = PolicyConfig(starvation_s=4 * 3600, protect_after_runs=1.0, preemption=False)
    holder = running(1, ["n0"] * 4, started=-600, time_limit_s=3600)
    for queued, reserved in ((-3600.0, False), (-5 * 3600.0, True)):
        big = replace(pending(2, dp=8), queued_at=at(queued))
        small = pending(3, dp=2, submitted=-10)  # no limit: runs past the big job's start
        decisions = by_id(schedule(TWO_BY_FOUR, [holder, big, small], NOW, config))
        assert isinstance(decisions[2], Wait) and decisions[2].reserved is reserved
        assert isinstance(decisions[3], Admit) is not reserved


def test_runtime_estimate_from_measured_progress() -> None:
    jobs = [
        running(1, ["n0"] * 4, started=-100, step=100, total_steps=1000, step_time_s=1.0),
        pending(2, dp=4),
    ]
    (wait,) = schedule(Cluster().nodes(1, 4).snapshot(), jobs, NOW)
    assert isinstance(wait, Wait) and wait.estimated_start_at == at(900)


def test_backfill_admits_a_short_job_that_ends_before_the_reservation() -> None:
    jobs = [
        running(1, ["n0"] * 4, started=-600, time_limit_s=3600),  # n0 free at +3000
        running(2, ["n1"] * 2, started=-600, time_limit_s=7200),  # n1 has 2 free now
        pending(3, dp=4, priority=5),  # head: reserved at +3000 on n0
        pending(4, dp=2, time_limit_s=1800),  # ends at +1800 < +3000
        pending(5, dp=2),  # no limit: assumed to run past +3000
    ]
    decisions = by_id(schedule(TWO_BY_FOUR, jobs, NOW, NO_PREEMPTION))
    head, short, long_job = decisions[3], decisions[4], decisions[5]
    assert isinstance(head, Wait) and head.reserved and head.estimated_start_at == at(3000)
    assert isinstance(short, Admit) and "backfilled" in short.reason
    assert isinstance(long_job, Wait)


def test_backfill_may_use_gpus_the_reserved_job_does_not_need() -> None:
    jobs = [
        running(1, ["n0"] * 2, started=-600, time_limit_s=3600),  # n0: 2 free, 4 at +3000
        running(3, ["n1"] * 4, started=-600, time_limit_s=7200),  # n1: full until +6600
        pending(2, tp=4, priority=5),  # one 4-GPU block: reserved on n0 at +3000
        pending(4, dp=2),  # fits n0's 2 free GPUs now, but with no limit runs past +3000
    ]
    decisions = by_id(schedule(TWO_BY_FOUR, jobs, NOW, NO_PREEMPTION))
    assert isinstance(decisions[2], Wait) and decisions[2].estimated_start_at == at(3000)
    four = decisions[4]
    assert isinstance(four, Wait) and four.explanation.blocker is Blocker.RESERVATION
    assert four.explanation.blocking_job_id == 2

    # With a third node whose 2 free GPUs job 2 never needs, job 4 starts there now.
    jobs.append(running(5, ["n2"] * 2, started=-600, time_limit_s=99_999))
    three_nodes = Cluster().nodes(3, 4).snapshot()
    decisions = by_id(schedule(three_nodes, jobs, NOW, NO_PREEMPTION))
    assert isinstance(decisions[4], Admit) and set(decisions[4].placement.node_ids) == {"n2"}


def test_backfill_off_keeps_strict_order() -> None:
    jobs = [
        running(1, ["n0"] * 4, started=-600, time_limit_s=3600),
        pending(2, dp=8, priority=5),
        pending(3, dp=1, time_limit_s=60),
    ]
    decisions = by_id(
        schedule(
            TWO_BY_FOUR,
            jobs,
            NOW,
            PolicyConfig(backfill=False, preemption=False, reservations=True),
        )
    )
    assert isinstance(decisions[3], Wait)


def test_preempts_the_cheapest_lower_priority_gangs_that_make_room() -> None:
    jobs = [
        running(1, ["n0"] * 2, priority=1),
        running(2, ["n0"] * 2, priority=0, step=10, step_time_s=1.0),  # 10 s lost
        running(3, ["n1"] * 4, priority=0, step=500, step_time_s=1.0),  # 500 s lost
        pending(4, dp=2, priority=9),
    ]
    decisions = schedule(TWO_BY_FOUR, jobs, NOW, PolicyConfig(checkpoint_grace_s=60))
    preempts = [d for d in decisions if isinstance(d, Preempt)]
    assert [(p.job_id, p.for_job_id, p.deadline) for p in preempts] == [(2, 4, at(60))]
    wait = by_id(decisions)[4]
    assert isinstance(wait, Wait) and wait.explanation.blocker is Blocker.PREEMPTING
    assert wait.estimated_start_at == at(60)


def test_preemption_prunes_victims_that_are_not_needed() -> None:
    jobs = [
        running(1, ["n0"], priority=0, started=-9000),  # cheapest by start time? older
        running(2, ["n0"] * 3, priority=0, started=-8000),
        pending(3, dp=3, priority=5),
    ]
    decisions = schedule(Cluster().nodes(1, 4).snapshot(), jobs, NOW)
    assert [d.job_id for d in decisions if isinstance(d, Preempt)] == [2]


def test_victims_chosen_with_fractional_cpus_make_room_in_the_freed_pool() -> None:
    """Sparing a victim is tried on free plus the other victims, summed afresh: taking a
    victim's CPUs out of a pool and giving them back leaves 0.2 as 0.20000000000000018, and
    a search on such a pool chose victims that did not make room (the pass then failed)."""

    def holder(job_id: int, node: str, tp: int, gpus: int, cpus: float, **kw: Any) -> JobView:
        shape = GangShape(Parallelism(tp=tp), gpus_per_rank=gpus, cpus_per_rank=cpus)
        return JobView(
            job_id,
            0,
            at(-1010),
            JobState.RUNNING,
            shape,
            Placement((node,) * tp),
            run=RunInfo(at(-1000)),
            **kw,
        )

    nodes = (Node("n0", "n0", 8, 4.8), Node("n1", "n1", 2, 32.0))
    jobs = [
        holder(1, "n0", 1, 1, 4.0, time_limit_s=3600),
        holder(2, "n0", 1, 5, 0.6, time_limit_s=7200, preemptible=False),
        holder(3, "n1", 2, 1, 1.0, time_limit_s=7200),
        JobView(
            4,
            1,
            at(-60),
            JobState.PENDING,
            GangShape(Parallelism(dp=2, tp=2), cpus_per_rank=0.1),
        ),
    ]
    decisions = schedule(ClusterSnapshot(nodes), jobs, NOW, PolicyConfig())
    assert sorted(d.job_id for d in decisions if isinstance(d, Preempt)) == [1, 3]
    wait = by_id(decisions)[4]
    assert isinstance(wait, Wait) and wait.explanation.blocker is Blocker.PREEMPTING


def test_never_preempts_higher_or_equal_priority_young_or_protected_jobs() -> None:
    config = PolicyConfig(min_runtime_s=600)
    for victim in (
        running(1, ["n0"] * 4, priority=5),  # equal: and no checkpoint, so no service preemption
        running(1, ["n0"] * 4, priority=0, started=-60),
        running(1, ["n0"] * 4, priority=0, preemptible=False),
    ):
        decisions = schedule(
            Cluster().nodes(1, 4).snapshot(), [victim, pending(2, dp=4, priority=5)], NOW, config
        )
        assert not any(isinstance(d, Preempt) for d in decisions)


def test_waits_for_gangs_already_preempting_instead_of_taking_more() -> None:
    jobs = [
        running(1, ["n0"] * 4, priority=0, state=JobState.PREEMPTING),
        running(2, ["n1"] * 4, priority=0),
        pending(3, dp=4, priority=9),
    ]
    decisions = schedule(TWO_BY_FOUR, jobs, NOW)
    assert not any(isinstance(d, Preempt) for d in decisions)
    wait = by_id(decisions)[3]
    assert isinstance(wait, Wait) and wait.explanation.blocker is Blocker.PREEMPTING


def behind_a_reservation(victim_state: JobState = JobState.RUNNING) -> list[JobView]:
    """Three 4-GPU nodes: n0 and n1 free at +3000 (priority-5 jobs), n2 held by a
    priority-0 job. Job 3 (8 GPUs) cannot make room and is reserved n0 + n1 at +3000;
    jobs 4 and 6 (4 GPUs each) queue behind it."""
    return [
        running(1, ["n0"] * 4, priority=5, time_limit_s=3600, started=-600),
        running(2, ["n1"] * 4, priority=5, time_limit_s=3600, started=-600),
        running(5, ["n2"] * 4, priority=0, state=victim_state),
        pending(3, dp=8, priority=5, submitted=-300),
        pending(4, dp=4, priority=5, submitted=-200),
        pending(6, dp=4, priority=5, submitted=-100),
    ]


def test_a_job_behind_the_reservation_preempts_gangs_the_reserved_job_never_needs() -> None:
    three_nodes = Cluster().nodes(3, 4).snapshot()
    decisions = schedule(three_nodes, behind_a_reservation(), NOW, EASY)
    preempts = [(d.job_id, d.for_job_id) for d in decisions if isinstance(d, Preempt)]
    assert preempts == [(5, 4)]  # once: job 6 does not count on job 5 again
    waits = by_id(decisions)
    head, beside, last = waits[3], waits[4], waits[6]
    assert isinstance(head, Wait) and head.reserved and head.estimated_start_at == at(3000)
    assert isinstance(beside, Wait) and beside.explanation.blocker is Blocker.PREEMPTING
    assert "beside the room held for job 3" in beside.explanation.message
    assert isinstance(last, Wait) and last.explanation.blocker is not Blocker.PREEMPTING

    # The next pass, job 5 still checkpointing: job 4 waits for it and takes no more.
    decisions = schedule(three_nodes, behind_a_reservation(JobState.PREEMPTING), NOW, EASY)
    assert not any(isinstance(d, Preempt) for d in decisions)
    beside, last = by_id(decisions)[4], by_id(decisions)[6]
    assert isinstance(beside, Wait) and "preempted job(s) 5 to checkpoint" in beside.reason
    assert isinstance(last, Wait) and last.explanation.blocker is not Blocker.PREEMPTING

    # No victim searches left in the pass: job 4 waits.
    decisions = schedule(
        three_nodes, behind_a_reservation(), NOW, replace(EASY, preemption_tries=0)
    )
    assert not any(isinstance(d, Preempt) for d in decisions)


def test_a_job_behind_the_reservation_counts_its_run_from_the_victims_deadline() -> None:
    jobs = [
        running(1, ["n0"] * 4, priority=5, time_limit_s=3600, started=-600),
        running(5, ["n1"] * 4, priority=0, time_limit_s=3600, started=-600),
        pending(3, dp=8, priority=5, submitted=-300),  # reserved n0 + n1 at +3000
        # from now it would end at +2950, before the reserved start; it can start only
        # once job 5 has checkpointed (+120), and would then end past it
        pending(4, dp=4, priority=5, submitted=-200, time_limit_s=2950),
    ]
    decisions = schedule(TWO_BY_FOUR, jobs, NOW, replace(EASY, checkpoint_grace_s=120))
    assert not any(isinstance(d, Preempt) for d in decisions)


def test_free_gpus_a_job_behind_the_reservation_counts_on_are_not_given_away() -> None:
    jobs = [
        running(1, ["n0"] * 4, priority=5, time_limit_s=3600, started=-600),
        running(2, ["n1"] * 4, priority=5, time_limit_s=3600, started=-600),
        running(6, ["n2"] * 4, priority=5, time_limit_s=3600, started=-600),
        running(5, ["n4"] * 4, priority=0),
        pending(3, dp=12, priority=5, submitted=-300),  # reserved n0 + n1 + n2 at +3000
        pending(4, dp=8, priority=5, submitted=-200),  # free n3 + job 5's n4
        pending(7, dp=4, priority=5, submitted=-100),  # n3 fits it, but job 4 counts on it
    ]
    decisions = schedule(Cluster().nodes(5, 4).snapshot(), jobs, NOW, EASY)
    assert [(d.job_id, d.for_job_id) for d in decisions if isinstance(d, Preempt)] == [(5, 4)]
    assert not any(isinstance(d, Admit) for d in decisions)


def test_jobs_behind_the_reservation_do_not_share_its_room_at_the_reserved_time() -> None:
    one_node = Cluster().nodes(1, 8).snapshot()
    jobs = [
        running(11, ["n0"] * 4, priority=9, time_limit_s=3600, started=-600),  # to +3000
        running(12, ["n0"] * 2, priority=0, time_limit_s=3600, started=-1600),  # to +2000
        running(13, ["n0"] * 2, priority=0, time_limit_s=3600, started=-1600),  # to +2000
        pending(1, dp=6, priority=5, submitted=-300),  # reserved 6 of n0's 8 at +3000
        pending(2, dp=2, priority=5, submitted=-200),  # runs past +3000 on 2 of the 8
        pending(3, dp=2, priority=5, submitted=-100),  # would too: 6 + 2 + 2 > 8
    ]
    decisions = schedule(one_node, jobs, NOW, EASY)
    assert [(d.job_id, d.for_job_id) for d in decisions if isinstance(d, Preempt)] == [(12, 2)]

    # Two jobs waiting for one preempting gang's room: only one gets it.
    four = Cluster().nodes(1, 4).snapshot()
    jobs = [
        running(10, ["n0"] * 4, state=JobState.PREEMPTING),
        pending(1, dp=2, priority=5, submitted=-300),  # holds 2 of its 4
        pending(2, dp=2, priority=5, submitted=-200),  # waits for the other 2
        pending(3, dp=2, priority=5, submitted=-100),  # nothing left for it
    ]
    waits = by_id(schedule(four, jobs, NOW, EASY))
    assert [waits[i].explanation.blocker for i in (1, 2, 3)] == [
        Blocker.PREEMPTING,
        Blocker.PREEMPTING,
        Blocker.CLUSTER_FULL,
    ]


def test_a_job_behind_the_reservation_does_not_preempt_into_the_reserved_room() -> None:
    jobs = [
        running(1, ["n0"] * 4, priority=5, time_limit_s=3600, started=-600),
        running(5, ["n1"] * 4, priority=0),  # no limit: n1 is free only when it ends
        pending(3, dp=8, priority=5, submitted=-300),  # reserved n0 + n1 at job 5's end
        pending(4, dp=4, priority=5, submitted=-200),  # on n1 it would outlast that start
    ]
    decisions = schedule(TWO_BY_FOUR, jobs, NOW, EASY)
    assert not any(isinstance(d, Preempt) for d in decisions)
    head = by_id(decisions)[3]
    assert isinstance(head, Wait) and head.reserved


def test_the_reservation_leaves_the_gpus_free_now_to_the_jobs_behind_it() -> None:
    jobs = [
        running(1, ["n1"] * 4, started=-600, time_limit_s=3600),  # n1 free at +3000
        running(2, ["n2"] * 4, started=-600, time_limit_s=3600),  # n2 free at +3000
        pending(3, dp=8, priority=5),  # reserved +3000: on n1 + n2, not on the free n0
        pending(4, dp=4),  # no limit: runs past +3000, so only n0 can take it now
    ]
    decisions = by_id(schedule(Cluster().nodes(3, 4).snapshot(), jobs, NOW, NO_PREEMPTION))
    head, backfilled = decisions[3], decisions[4]
    assert isinstance(head, Wait) and head.reserved and head.estimated_start_at == at(3000)
    assert isinstance(backfilled, Admit) and backfilled.placement.node_ids == ("n0",) * 4


def test_node_shape_explanation() -> None:
    jobs = [running(1, ["n0"] * 2), running(2, ["n1"] * 2), pending(3, tp=4, priority=0)]
    (wait,) = schedule(TWO_BY_FOUR, jobs, NOW, PolicyConfig(preemption=False))
    assert isinstance(wait, Wait)
    assert wait.explanation.blocker is Blocker.NODE_SHAPE
    assert "largest free block is 2" in wait.explanation.message


def test_jobs_that_cannot_fit_the_alive_nodes_wait_without_an_eta() -> None:
    snapshot = Cluster().nodes(1, 4).nodes(1, 4, alive=False).snapshot()
    (wait,) = schedule(snapshot, [pending(1, dp=8)], NOW)
    assert isinstance(wait, Wait) and wait.estimated_start_at is None
    assert "cannot hold it" in wait.explanation.message


def test_later_blocked_jobs_get_conservative_etas_up_to_the_horizon() -> None:
    jobs = [
        running(1, ["n0"] * 4, started=-600, time_limit_s=1200),  # free at +600
        running(2, ["n1"] * 4, started=-600, time_limit_s=2400),  # free at +1800
        pending(3, dp=4, priority=3),
        pending(4, dp=4, priority=2),
        pending(5, dp=4, priority=1),
    ]
    config = PolicyConfig(eta_jobs=1, preemption=False, reservations=True)
    decisions = by_id(schedule(TWO_BY_FOUR, jobs, NOW, config))
    assert [decisions[i].estimated_start_at for i in (3, 4, 5)] == [at(600), at(1800), None]  # type: ignore[union-attr]


def test_jobs_beyond_the_horizon_get_a_gpu_count_estimate() -> None:
    jobs = [
        running(i, [f"n{i - 1}"] * 4, started=-600, time_limit_s=t)
        for i, t in ((1, 1200), (2, 2400), (3, 4200), (4, 7800))
    ]  # 4 GPUs back at +600, +1800, +3600, +7200
    jobs += [pending(10, dp=4, priority=3), pending(11, dp=4, priority=2), pending(12, dp=4)]
    config = PolicyConfig(eta_jobs=0, preemption=False, reservations=True)
    decisions = by_id(schedule(Cluster().nodes(4, 4).snapshot(), jobs, NOW, config))
    etas = [decisions[i].estimated_start_at for i in (10, 11, 12)]  # type: ignore[union-attr]
    assert etas == [at(600), at(1800), at(3600)]


def test_an_estimate_keeps_every_other_field_of_the_wait() -> None:
    """`Wait.estimated` lists the fields by hand (for speed): a field added to Wait and
    not copied there fails here."""
    why = Explanation(Blocker.RESERVATION, "m", "u", 7)
    wait = Wait(3, why, at(60), True, 2.5)
    assert {f.name for f in fields(Wait)} == {
        "job_id",
        "explanation",
        "estimated_start_at",
        "reserved",
        "protected",
    }
    assert wait.estimated(at(900)) == replace(wait, estimated_start_at=at(900))
    assert wait.estimated(None) == replace(wait, estimated_start_at=None)


# -- properties ---------------------------------------------------------------------------

NODE_IDS = [f"n{i}" for i in range(4)]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[JobView]]:
    gpus = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4))
    cluster = Cluster()
    for count in gpus:
        cluster.nodes(1, count)
    snapshot = cluster.snapshot()
    free = {n.id: n.num_gpus for n in snapshot.nodes}
    jobs: list[JobView] = []
    for job_id in range(1, draw(st.integers(0, 4)) + 1):
        node = draw(st.sampled_from(sorted(free)))
        size = draw(st.integers(0, free[node]))
        if size:
            free[node] -= size
            jobs.append(
                running(
                    job_id,
                    [node] * size,
                    priority=draw(st.integers(0, 3)),
                    started=-draw(st.integers(0, 7200)),
                    time_limit_s=draw(st.sampled_from([None, 600.0, 3600.0])),
                    preemptible=draw(st.booleans()),
                    dp_range=draw(st.sampled_from([None, (1, size + 2), (size, size)])),
                    step=draw(st.sampled_from([0, 100, 5000])),  # = steps since checkpoint
                    step_time_s=draw(st.sampled_from([None, 1.0])),
                )
            )
    for job_id in range(10, 10 + draw(st.integers(0, 8))):
        dp = draw(st.integers(1, 4))
        jobs.append(
            pending(
                job_id,
                dp=dp,
                dp_min=draw(st.sampled_from([None, 1, dp])),
                tp=draw(st.sampled_from([1, 2])),
                priority=draw(st.integers(0, 5)),
                submitted=-draw(st.integers(0, 20_000)),
                time_limit_s=draw(st.sampled_from([None, 300.0, 5000.0])),
            )
        )
        attained = draw(st.sampled_from([0.0, 5000.0, 50_000.0]))
        jobs[-1] = replace(jobs[-1], attained_gpu_s=attained)
    return snapshot, jobs


@given(scenarios())
def test_properties_of_every_pass(scenario: tuple[ClusterSnapshot, list[JobView]]) -> None:
    snapshot, jobs = scenario
    decisions = schedule(snapshot, jobs, NOW)
    views = {j.id: j for j in jobs}

    # deterministic, whatever the input order
    assert decisions == schedule(snapshot, list(reversed(jobs)), NOW)

    # every pending job gets exactly one Admit or Wait
    pending_ids = {j.id for j in jobs if j.state is JobState.PENDING}
    waits_and_admits = [d.job_id for d in decisions if isinstance(d, Admit | Wait)]
    assert sorted(waits_and_admits) == sorted(pending_ids)
    # ... in queue order (the loop numbers the waiting jobs by it)
    queued = [j.id for j in queue_order([views[i] for i in pending_ids], NOW, PolicyConfig())]
    assert waits_and_admits == queued

    resized = _check_resizes(decisions, views)
    _check_no_overcommit(snapshot, jobs, decisions, views, resized)

    # a job is only preempted for a job of strictly higher priority, or of the same
    # priority and less attained service when little work since its checkpoint is lost
    config = PolicyConfig()
    # ... each holder at most once in a pass, by one preemption or one resize
    touched = [d.job_id for d in decisions if isinstance(d, Preempt | Resize)]
    assert len(touched) == len(set(touched))
    for decision in decisions:
        if isinstance(decision, Preempt):
            victim, job = views[decision.job_id], views[decision.for_job_id]
            assert victim.preemptible
            assert rank(victim, NOW, config) < rank(job, NOW, config)
            if victim.priority == job.priority:
                assert work_lost_s(victim, NOW) <= config.service_preemption_loss_s

    # no admitted job delays the reserved job: it still fits at its reserved time
    reserved = [d for d in decisions if isinstance(d, Wait) and d.reserved]
    assert len(reserved) <= 1
    if reserved and reserved[0].explanation.blocker is not Blocker.PREEMPTING and not resized:
        _check_reservation_kept(snapshot, jobs, decisions, views, reserved[0])


def _check_resizes(decisions: Sequence[Decision], views: dict[int, JobView]) -> dict[int, Resize]:
    """Only elastic jobs are resized, within their range, with whole replicas."""
    resized = {d.job_id: d for d in decisions if isinstance(d, Resize)}
    for job_id, resize in resized.items():
        shape = views[job_id].shape
        assert shape.dp_min is not None and shape.dp_max is not None
        assert shape.dp_min <= resize.dp <= shape.dp_max
        assert len(resize.placement.node_ids) == resize.dp * shape.replica_ranks
    return resized


def _check_no_overcommit(
    snapshot: ClusterSnapshot,
    jobs: list[JobView],
    decisions: Sequence[Decision],
    views: dict[int, JobView],
    resized: dict[int, Resize],
) -> None:
    """No node over-allocated (resized jobs at their new size); gangs whole; TP groups on
    one node; elastic jobs admitted within their range."""
    used: Counter[str] = Counter()
    for job in jobs:
        placement = resized[job.id].placement if job.id in resized else job.placement
        if placement:
            used.update(placement.node_ids)
    for decision in decisions:
        if not isinstance(decision, Admit):
            continue
        shape = views[decision.job_id].shape
        ranks = len(decision.placement.node_ids)
        smallest = (shape.dp_min or shape.parallelism.dp) * shape.replica_ranks
        assert smallest <= ranks <= shape.num_ranks
        tp = shape.parallelism.tp
        for group in range(ranks // tp):
            assert len(set(decision.placement.node_ids[group * tp : (group + 1) * tp])) == 1
        used.update(decision.placement.node_ids)
    capacity = {n.id: n.num_gpus for n in snapshot.nodes}
    assert all(used[node] <= capacity[node] for node in used)


def _check_reservation_kept(
    snapshot: ClusterSnapshot,
    jobs: list[JobView],
    decisions: Sequence[Decision],
    views: dict[int, JobView],
    reserved: Wait,
) -> None:
    later = {d.job_id for d in decisions if isinstance(d, Admit)}
    check = [j for j in jobs if j.id not in later] + [
        _as_running(views[d.job_id], d) for d in decisions if isinstance(d, Admit)
    ]
    again = by_id(schedule(snapshot, check, NOW))[reserved.job_id]
    if isinstance(again, Wait):
        assert again.estimated_start_at is not None and reserved.estimated_start_at is not None
        assert again.estimated_start_at <= reserved.estimated_start_at


def _as_running(job: JobView, admit: Admit) -> JobView:
    nodes = list(admit.placement.node_ids)
    return running(
        job.id,
        nodes,
        tp=job.shape.parallelism.tp,
        priority=job.priority,
        started=0,
        time_limit_s=job.time_limit_s,
        preemptible=False,
    )


@given(st.integers(0, 5), st.integers(1, 20))
def test_aging_bounds_the_wait_behind_a_stream_of_higher_priority_jobs(
    delta: int, jobs_ahead: int
) -> None:
    """A priority-0 job on a one-GPU cluster, with a new priority-`delta` job arriving every
    interval: aged `delta` points it ranks with them (a job of their class), and ahead of
    every one, having entered the same service band first."""
    config = PolicyConfig(aging_interval_s=100)
    waited = (delta + 1) * 100
    old = pending(1, priority=0, submitted=-waited)
    stream = [
        pending(100 + i, priority=delta, submitted=-i * 1.0) for i in range(min(jobs_ahead, 100))
    ]
    decisions = schedule(Cluster().nodes(1, 1).snapshot(), [*stream, old], NOW, config)
    assert admitted(decisions) == [1]


class _Forgetful(set[tuple[object, ...]]):
    """A victim memo that never remembers: every blocked job searches for itself."""

    def add(self, element: tuple[object, ...]) -> None:
        pass


@dataclass
class _PassWithoutVictimMemo(schedule_module._Pass):
    no_victims: set[tuple[object, ...]] = field(default_factory=_Forgetful)


# Preemption at any moment and no reservations: every blocked job tries preemption.
TIRESIAS_LIKE = PolicyConfig(
    reservations=False, min_runtime_s=0.0, service_preemption_loss_s=1e15, starvation_s=1e15
)


@given(scenarios(), st.sampled_from([PolicyConfig(), TIRESIAS_LIKE]))
def test_the_victim_memo_decides_as_a_search_per_blocked_job(
    scenario: tuple[ClusterSnapshot, list[JobView]], config: PolicyConfig
) -> None:
    snapshot, jobs = scenario
    remembered = schedule(snapshot, jobs, NOW, config)
    with patch.object(schedule_module, "_Pass", _PassWithoutVictimMemo):
        searched = schedule(snapshot, jobs, NOW, config)
    assert remembered == searched
