"""Jobs that wait for jobs, in the pure core: every condition against every upstream
outcome, cascades, and what a held job is told by a scheduling pass."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from scheduler.core import Admit, Blocker, PolicyConfig, Wait, schedule
from scheduler.core.dependencies import (
    Holds,
    OpenDependency,
    Upstream,
    dependency_waits,
    holds,
    settle,
)
from scheduler.model import Condition, JobState
from tests.unit.builders import NOW, Cluster, at, pending, running

S, E, F, T = Condition.SUCCEEDED, Condition.ENDED, Condition.FAILED, Condition.STARTED
MET, WAIT, NEVER = Holds.MET, Holds.WAITING, Holds.NEVER

# (upstream state, has it run) -> what each condition makes of it: succeeded, ended,
# failed, started.
OUTCOMES = {
    (JobState.PENDING, False): (WAIT, WAIT, WAIT, WAIT),
    (JobState.ADMITTED, False): (WAIT, WAIT, WAIT, WAIT),
    (JobState.STARTING, False): (WAIT, WAIT, WAIT, WAIT),
    (JobState.RUNNING, True): (WAIT, WAIT, WAIT, MET),
    (JobState.PREEMPTING, True): (WAIT, WAIT, WAIT, MET),
    (JobState.PENDING, True): (WAIT, WAIT, WAIT, MET),  # preempted after running
    (JobState.RESTARTING, True): (WAIT, WAIT, WAIT, MET),
    (JobState.SUCCEEDED, True): (MET, MET, NEVER, MET),
    (JobState.FAILED, True): (NEVER, MET, MET, MET),
    (JobState.FAILED, False): (NEVER, MET, MET, NEVER),  # never placed
    (JobState.CANCELLED, True): (NEVER, MET, MET, MET),
    (JobState.CANCELLED, False): (NEVER, MET, MET, NEVER),
}


@pytest.mark.parametrize(("state", "started"), list(OUTCOMES))
@pytest.mark.parametrize("index", range(4))
def test_every_condition_against_every_upstream_outcome(
    state: JobState, started: bool, index: int
) -> None:
    condition = (S, E, F, T)[index]
    assert holds(Upstream(1, condition, state, started)) is OUTCOMES[(state, started)][index]


def _dep(
    job: int, upstream: int, state: JobState, on: Condition = S, *, ran: bool = False
) -> OpenDependency:
    return OpenDependency(job, JobState.PENDING, Upstream(upstream, on, state, ran))


def test_a_met_condition_is_closed_and_the_job_is_no_longer_held() -> None:
    settled = settle([_dep(2, 1, JobState.SUCCEEDED, ran=True)])
    assert settled.met == ((2, 1),)
    assert settled.waiting == {} and settled.cancel == ()


def test_a_job_is_held_until_every_upstream_job_holds() -> None:
    settled = settle(
        [_dep(3, 1, JobState.SUCCEEDED, ran=True), _dep(3, 2, JobState.RUNNING, E, ran=True)]
    )
    assert settled.met == ((3, 1),)
    assert list(settled.waiting) == [3]
    assert [u.job_id for u in settled.waiting[3]] == [2]


def test_a_condition_that_cannot_hold_cancels_the_chain_to_its_end_in_one_call() -> None:
    # 1 FAILED; 2 waits for its success, 3 for 2's, 4 for 3's start, 5 for 4's end.
    settled = settle(
        [
            _dep(5, 4, JobState.PENDING, E),
            _dep(4, 3, JobState.PENDING, T),
            _dep(3, 2, JobState.PENDING),
            _dep(2, 1, JobState.FAILED, ran=True),
        ]
    )
    assert [job for job, _ in settled.cancel] == [2, 3, 4]
    reasons = dict(settled.cancel)
    assert reasons[2] == "cancelled: waited for job 1 to succeed, but it ended FAILED"
    assert reasons[3] == "cancelled: waited for job 2 to succeed, but it ended CANCELLED"
    assert reasons[4] == (
        "cancelled: waited for job 3 to start, but it ended CANCELLED without running"
    )
    # 4 ended (cancelled): 5 waited for any end, so its condition holds.
    assert settled.met == ((5, 4),) and settled.waiting == {}


def test_failed_counts_a_cancelled_upstream_as_not_succeeded() -> None:
    settled = settle([_dep(3, 2, JobState.PENDING, F), _dep(2, 1, JobState.FAILED, ran=True)])
    assert [job for job, _ in settled.cancel] == [2]
    assert settled.met == ((3, 2),)


def test_a_waiting_job_that_left_pending_closes_its_rows() -> None:
    gone = OpenDependency(2, JobState.CANCELLED, Upstream(1, S, JobState.RUNNING, True))
    settled = settle([gone])
    assert settled.closed == (2,) and settled.waiting == {} and settled.cancel == ()


def test_a_held_job_waits_for_the_upstream_ending_last_with_its_predicted_end() -> None:
    up_early = running(1, ["n0"], started=-600, step=100, total_steps=200, step_time_s=6.0)
    up_late = running(2, ["n1"], started=-600, step=100, total_steps=400, step_time_s=6.0)
    held = pending(3)
    waiting = {3: (Upstream(1, S, JobState.RUNNING, True), Upstream(2, S, JobState.RUNNING, True))}
    decisions = schedule(
        Cluster().nodes(2, 1).snapshot(), [up_early, up_late, held], NOW, waiting=waiting
    )
    (wait,) = [d for d in decisions if isinstance(d, Wait)]
    assert wait.job_id == 3 and wait.explanation.blocker is Blocker.DEPENDENCY
    assert wait.explanation.blocking_job_id == 2
    end = at(-600 + 400 * 6.0)
    assert wait.estimated_start_at == end
    assert wait.explanation.message == (
        f"waits for job 2 (RUNNING, predicted to end ~{end:%H:%M} UTC) and 1 more"
    )
    assert wait.explanation.unblock == "starts once job 2 succeeds"


def test_a_held_job_takes_no_gpus_and_no_place_in_the_queue() -> None:
    """The cluster is free: the held job waits, the one behind it starts."""
    waiting = {1: (Upstream(9, S, JobState.RUNNING, True),)}
    decisions = schedule(
        Cluster().nodes(1, 1).snapshot(), [pending(1), pending(2)], NOW, waiting=waiting
    )
    assert [type(d).__name__ for d in decisions] == ["Admit", "Wait"]
    assert isinstance(decisions[0], Admit) and decisions[0].job_id == 2
    assert decisions[1].job_id == 1


def test_a_chain_of_estimates_builds_on_the_upstream_waits() -> None:
    """3 waits for 2 (pending behind a full cluster, 1 h limit), 4 for 3's start."""
    full = running(1, ["n0"], time_limit_s=1800, started=-600)
    queued = pending(2, time_limit_s=3600)
    held3, held4 = pending(3, time_limit_s=600), pending(4)
    waiting = {
        3: (Upstream(2, S, JobState.PENDING, False),),
        4: (Upstream(3, T, JobState.PENDING, False),),
    }
    decisions = schedule(
        Cluster().nodes(1, 1).snapshot(), [full, queued, held3, held4], NOW, waiting=waiting
    )
    waits = {d.job_id: d for d in decisions if isinstance(d, Wait)}
    assert waits[2].estimated_start_at == at(1200)  # when job 1 reaches its limit
    assert waits[3].estimated_start_at == at(1200 + 3600)
    assert waits[4].estimated_start_at == at(1200 + 3600)  # 3 starts when 2 ends
    assert "predicted to start" in waits[4].explanation.message


def test_no_estimate_without_a_basis_for_the_upstream_run_time() -> None:
    unknown = running(1, ["n0"])  # no limit, no measured steps, no prediction
    waits = dependency_waits(
        {2: (Upstream(1, S, JobState.RUNNING, True),)},
        {1: unknown, 2: pending(2)},
        [],
        NOW,
        _config(),
    )
    assert waits[0].estimated_start_at is None
    assert waits[0].explanation.message == "waits for job 1 (RUNNING)"


def test_a_prediction_on_another_day_names_the_date() -> None:
    far = running(1, ["n0"], started=0, time_limit_s=2 * 86400)
    (wait,) = dependency_waits(
        {2: (Upstream(1, E, JobState.RUNNING, True),)},
        {1: far, 2: pending(2)},
        [],
        NOW,
        _config(),
    )
    assert wait.estimated_start_at == NOW + timedelta(days=2)
    assert "predicted to end ~Jan 03 12:00 UTC" in wait.explanation.message


def _config() -> PolicyConfig:
    return PolicyConfig()


def test_a_job_on_hold_waits_for_its_release_and_takes_no_gpus() -> None:
    held = replace(pending(1), hold="paused by sweep 3 at rung 1")
    decisions = schedule(Cluster().nodes(1, 1).snapshot(), [held, pending(2)], NOW)
    assert isinstance(decisions[0], Admit) and decisions[0].job_id == 2
    wait = decisions[1]
    assert isinstance(wait, Wait) and wait.job_id == 1
    assert wait.explanation.blocker is Blocker.HOLD
    assert wait.reason == "held: paused by sweep 3 at rung 1; starts once released"
