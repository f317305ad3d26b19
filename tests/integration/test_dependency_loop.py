"""Jobs that wait for jobs, through the scheduler loop on a real database (SQLite and
PostgreSQL), with fakes at the Ray seam: held while the condition may hold, started once
it does, cancelled with the reason (and the chain behind it) once it cannot, across a
service restart and a leader failover."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from scheduler.model import Condition, JobState
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.loop import SchedulerLoop
from scheduler.store import JobRecord, JobRepository, NewJob
from tests.integration.test_loop import Clock, FakeExecutor, make_loop, transitions
from tests.integration.test_loop import clock as clock
from tests.integration.test_loop import executor as executor
from tests.integration.test_loop import loop as loop
from tests.integration.test_loop import repo as repo


def submit(
    repo: JobRepository, *after: tuple[JobRecord, Condition], dp: int = 2, **spec: Any
) -> JobRecord:
    full = {
        "parallelism": {"dp": dp, "tp": 1, "pp": 1},
        "resources": {"gpus_per_rank": 1, "cpus_per_rank": 1.0},
        "entrypoint": {"kind": "builtin", "model": "gpt-tiny", "steps": 10},
        "time_limit_s": 3600,
        **spec,
    }
    new = NewJob(
        name="j",
        queue="default",
        priority=0,
        spec=full,
        num_gpus=dp,
        total_steps=10,
        depends_on=tuple((job.id, on) for job, on in after),
    )
    return repo.create(new)


def run_to(loop: SchedulerLoop, executor: FakeExecutor, job: JobRecord, phase: GroupPhase) -> None:
    """Start `job`'s gang (it must be launched) and report `phase`."""
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    loop.tick()
    if phase is not GroupPhase.RUNNING:
        executor.statuses[job.id] = GroupStatus(phase, True, step=10)
        loop.tick()


def launched(executor: FakeExecutor) -> list[int]:
    return [job_id for job_id, _, _ in executor.launched]


def test_a_job_waits_for_its_upstream_and_starts_once_it_succeeds(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    first = submit(repo)
    second = submit(repo, (first, Condition.SUCCEEDED))
    loop.tick()
    assert launched(executor) == [first.id]  # the cluster had room for both
    held = repo.get(second.id)
    assert held.state is JobState.PENDING
    assert held.status_reason.startswith(f"waits for job {first.id} (PENDING")
    assert held.explanation is not None and held.explanation["blocker"] == "dependency"
    assert held.estimated_start_at is not None  # the upstream's time limit tells its end

    run_to(loop, executor, first, GroupPhase.RUNNING)
    loop.tick()  # a wait is explained before the pass polls the gangs
    assert (
        f"waits for job {first.id} (RUNNING, predicted to end" in repo.get(second.id).status_reason
    )
    run_to(loop, executor, first, GroupPhase.SUCCEEDED)
    loop.tick()
    assert launched(executor) == [first.id, second.id]
    [link] = repo.links(second.id).upstream
    assert (link.job_id, link.waiting, link.met_at is not None) == (first.id, False, True)
    [down] = repo.links(first.id).downstream
    assert down.job_id == second.id
    assert repo.open_dependencies() == []


@pytest.mark.parametrize(
    ("outcome", "on", "starts"),
    [
        (GroupPhase.FAILED, Condition.SUCCEEDED, False),
        (GroupPhase.FAILED, Condition.ENDED, True),
        (GroupPhase.FAILED, Condition.FAILED, True),
        (GroupPhase.SUCCEEDED, Condition.FAILED, False),
        (GroupPhase.SUCCEEDED, Condition.ENDED, True),
    ],
)
def test_each_condition_on_an_upstream_outcome(
    repo: JobRepository,
    loop: SchedulerLoop,
    *,
    executor: FakeExecutor,
    outcome: GroupPhase,
    on: Condition,
    starts: bool,
) -> None:
    first = submit(repo)
    second = submit(repo, (first, on))
    loop.tick()
    run_to(loop, executor, first, outcome)
    loop.tick()
    state = repo.get(second.id).state
    if starts:
        assert second.id in launched(executor) and state is not JobState.PENDING
    else:
        assert state is JobState.CANCELLED and second.id not in launched(executor)


def test_started_lets_the_second_job_run_beside_the_first(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    first = submit(repo)
    second = submit(repo, (first, Condition.STARTED))
    loop.tick()
    assert launched(executor) == [first.id]
    run_to(loop, executor, first, GroupPhase.RUNNING)
    loop.tick()
    assert launched(executor) == [first.id, second.id]


def test_a_failure_cancels_a_chain_of_three_in_one_pass_with_one_event_each(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    first = submit(repo)
    chain = [submit(repo, (first, Condition.SUCCEEDED))]
    for _ in range(2):
        chain.append(submit(repo, (chain[-1], Condition.SUCCEEDED)))
    loop.tick()
    executor.statuses[first.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    loop.tick()
    executor.statuses[first.id] = GroupStatus(GroupPhase.FAILED, True, step=3, error="boom")
    loop.tick()  # the failure is seen in this pass's poll; the next pass settles
    loop.tick()
    upstream = first
    for job in chain:
        record = repo.get(job.id)
        assert record.state is JobState.CANCELLED
        assert transitions(repo, job.id) == ["PENDING", "CANCELLED"]
        ended = "FAILED" if upstream is first else "CANCELLED"
        assert record.status_reason == (
            f"cancelled: waited for job {upstream.id} to succeed, but it ended {ended}"
        )
        upstream = job
    assert launched(executor) == [first.id]
    assert repo.open_dependencies() == []


def test_dependencies_hold_across_a_service_restart(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    first = submit(repo)
    second = submit(repo, (first, Condition.SUCCEEDED))
    loop.tick()
    executor.statuses[first.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    loop.tick()

    # The service dies; Ray keeps the gang; a new service reattaches it.
    restarted = FakeExecutor(attachable={first.id})
    again = make_loop(repo, restarted, clock)
    again.reconcile()
    again.tick()
    assert repo.get(second.id).state is JobState.PENDING and restarted.launched == []
    restarted.statuses[first.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=10)
    again.tick()
    again.tick()
    assert launched(restarted) == [second.id]


def test_a_standby_that_takes_over_keeps_the_dependencies(
    repo: JobRepository, clock: Clock
) -> None:
    leader_executor, standby_executor = FakeExecutor(), FakeExecutor()
    leader = make_loop(
        repo, leader_executor, clock, lease=LeaderLease(repo, ttl_s=3, holder="leader")
    )
    standby = make_loop(
        repo, standby_executor, clock, lease=LeaderLease(repo, ttl_s=3, holder="standby")
    )
    assert leader.lead()
    first = submit(repo)
    second = submit(repo, (first, Condition.SUCCEEDED))
    third = submit(repo, (second, Condition.SUCCEEDED))
    leader.tick()
    leader_executor.statuses[first.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    leader.tick()

    # the leader stopped renewing; 3 s, as test_loop's takeover: with 1 s a loaded machine
    # let the lease run out between the leader's two passes above (Fenced mid-pass)
    time.sleep(3.1)
    standby_executor.attachable.add(first.id)
    assert standby.lead()
    standby.tick()
    assert standby_executor.launched == []  # 2 and 3 still wait
    standby_executor.statuses[first.id] = GroupStatus(GroupPhase.FAILED, True, error="x")
    standby.tick()
    standby.tick()
    assert repo.get(second.id).state is JobState.CANCELLED
    assert repo.get(third.id).state is JobState.CANCELLED
    assert not leader.lead()


def test_a_user_cancelling_a_held_job_closes_its_dependencies(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    first = submit(repo)
    second = submit(repo, (first, Condition.SUCCEEDED))
    loop.tick()
    repo.transition(second.id, JobState.CANCELLED, reason="cancelled by user")
    loop.tick()
    assert repo.open_dependencies() == []
    [link] = repo.links(first.id).downstream
    assert (link.waiting, link.met_at) == (False, None)


def test_a_job_submitted_while_a_pass_settles_is_not_started_without_its_condition(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, monkeypatch: Any
) -> None:
    """A submit that commits right after the pass read the open dependencies is left
    to the next pass (the jobs are loaded before the dependencies are read)."""
    first = submit(repo)
    late: list[JobRecord] = []
    real = repo.open_dependencies

    def then_a_submit() -> Any:
        found = real()
        if not late:
            late.append(submit(repo, (first, Condition.SUCCEEDED)))
        return found

    monkeypatch.setattr(repo, "open_dependencies", then_a_submit)
    for _ in range(3):
        loop.tick()
    assert launched(executor) == [first.id]
    assert repo.get(late[0].id).state is JobState.PENDING


def test_a_released_job_says_what_let_it_go_and_queues_from_then(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    first = submit(repo)
    second = submit(repo, (first, Condition.SUCCEEDED))
    loop.tick()
    clock.now += timedelta(hours=3)  # a long wait that must not count as queueing
    run_to(loop, executor, first, GroupPhase.SUCCEEDED)
    loop.tick()
    released = next(e for e in repo.events(second.id) if e.reason.startswith("dependencies met"))
    assert released.reason == f"dependencies met: job {first.id} SUCCEEDED"
    assert repo.get(second.id).queued_at == clock.now
