"""The scheduler loop on a real database, with fakes at the Ray seam (principle 12)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.model import JobState, Node, QueueQuota
from scheduler.runtime import metrics
from scheduler.runtime.executor import group_spec
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.lifecycle import LifecycleConfig
from scheduler.runtime.loop import SchedulerLoop
from scheduler.runtime.stragglers import StragglerWatch
from scheduler.store import JobRecord, JobRepository, NewJob, QueueRepository

NODES = [Node("id-1", "local-1", 4, 8.0), Node("id-2", "local-2", 4, 8.0)]


@dataclass
class FakeCluster:
    nodes_: list[Node] = field(default_factory=lambda: list(NODES))

    def nodes(self) -> list[Node]:
        return list(self.nodes_)


@dataclass
class FakeExecutor:
    """Records what the loop asks for; tests set the status each group reports."""

    statuses: dict[int, GroupStatus] = field(default_factory=dict)
    launched: list[tuple[int, int, tuple[str, ...]]] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    attachable: set[int] = field(default_factory=set)
    reaped: list[tuple[int, int]] = field(default_factory=list)
    on_ray: set[tuple[int, int]] = field(default_factory=set)  # what sweep finds

    def reap(self, job: JobRecord) -> None:
        self.release(job.id)
        self.reaped.append((job.id, job.attempt))

    def sweep(self, active: Set[tuple[int, int]]) -> list[tuple[int, int]]:
        orphans = sorted(self.on_ray - set(active))
        self.reaped.extend(orphans)
        self.on_ray -= set(orphans)
        return orphans

    def forget(self) -> None:
        self.statuses.clear()

    def stop(self, job_id: int) -> None:
        self.stopped.append(job_id)

    def launch(self, job: JobRecord) -> None:
        assert job.placement is not None
        self.launched.append((job.id, job.attempt, job.placement))
        self.statuses[job.id] = GroupStatus(GroupPhase.PLACING)

    def attach(self, job: JobRecord) -> bool:
        if job.id in self.attachable:
            self.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, ranks_started=True)
            return True
        return False

    def poll(self) -> dict[int, GroupStatus]:
        return dict(self.statuses)

    def release(self, job_id: int) -> None:
        if self.statuses.pop(job_id, None) is not None:
            self.released.append(job_id)

    def job_ids(self) -> set[int]:
        return set(self.statuses)

    def stacks(self, job_id: int) -> str:
        return f"=== rank 0 ===\nthread rank-0: stuck in job {job_id}"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def executor() -> FakeExecutor:
    return FakeExecutor()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def repo(repo: JobRepository, clock: Clock) -> JobRepository:
    """The shared repository, stamping rows with the test's clock."""
    return repo.with_clock(clock)


def make_loop(
    repo: JobRepository, executor: FakeExecutor, clock: Clock, **options: Any
) -> SchedulerLoop:
    return SchedulerLoop(
        repo=repo, cluster=FakeCluster(), executor=executor, clock=clock, **options
    )


@pytest.fixture
def loop(repo: JobRepository, executor: FakeExecutor, clock: Clock) -> SchedulerLoop:
    return make_loop(repo, executor, clock)


SPEC: dict[str, Any] = {
    "parallelism": {"dp": 2, "tp": 1, "pp": 1},
    "resources": {"gpus_per_rank": 1, "cpus_per_rank": 1.0},
    "entrypoint": {"kind": "builtin", "model": "gpt-tiny", "steps": 10},
}


def submit(
    repo: JobRepository, *, dp: int = 2, priority: int = 0, steps: int = 10, **spec: Any
) -> JobRecord:
    full = {
        "parallelism": {"dp": dp, "tp": 1, "pp": 1},
        "resources": {"gpus_per_rank": 1, "cpus_per_rank": 1.0},
        "entrypoint": {"kind": "builtin", "model": "gpt-tiny", "steps": steps},
        "max_restarts": 0,
        "time_limit_s": None,
        **spec,
    }
    new = NewJob(
        name="j", queue="default", priority=priority, spec=full, num_gpus=dp, total_steps=steps
    )
    return repo.create(new)


def transitions(repo: JobRepository, job_id: int) -> list[str]:
    return [e.to_state.value for e in repo.events(job_id)]


def test_a_job_goes_from_pending_to_succeeded(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    job = submit(repo)
    loop.tick()
    assert executor.launched == [(job.id, 1, ("id-1", "id-1"))]
    assert repo.get(job.id).state is JobState.STARTING
    assert [n.name for n in repo.nodes()] == ["local-1", "local-2"]

    executor.statuses[job.id] = GroupStatus(
        GroupPhase.RUNNING,
        True,
        step=4,
        loss=3.0,
        first_loss=5.5,
        tokens_per_s=9.0,
        step_time_s=0.25,
        memory_mb=512.0,
    )
    loop.tick()
    [point] = repo.metrics(job.id)
    assert (point.attempt, point.step, point.step_time_s, point.memory_mb) == (1, 4, 0.25, 512.0)
    running = repo.get(job.id)
    assert (running.state, running.step, running.loss, running.first_loss) == (
        JobState.RUNNING,
        4,
        3.0,
        5.5,
    )

    executor.statuses[job.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=10, loss=1.0)
    loop.tick()
    done = repo.get(job.id)
    assert (done.state, done.step, done.loss) == (JobState.SUCCEEDED, 10, 1.0)
    assert executor.released == [job.id]
    assert transitions(repo, job.id) == ["PENDING", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]


def test_a_pass_says_whether_a_gang_is_still_on_its_way(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    assert loop.tick() is False  # nothing to do
    job = submit(repo)
    assert loop.tick() is True  # admitted: starting
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    assert loop.tick() is True  # was STARTING when polled; RUNNING from now on
    assert loop.tick() is False


def test_a_pass_over_a_queue_that_did_not_change_writes_nothing(
    repo: JobRepository,
    loop: SchedulerLoop,
    executor: FakeExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 15: a big queue waits through many passes; each may cost the decision, not a
    rewrite of every explanation, prediction and node. A change is still seen at once."""
    running = submit(repo, dp=8)  # every GPU
    waiting = [submit(repo, dp=2, priority=-1) for _ in range(3)]
    loop.tick()
    executor.statuses[running.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    loop.tick()
    loop.tick()
    writes: list[str] = []
    for name in ("explain_waits", "replace_nodes", "record_predictions", "transition"):
        real = getattr(repo, name)

        def spy(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            if _name != "explain_waits" or args[0]:  # an empty batch writes nothing
                writes.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(repo, name, spy)
    loop.tick()
    assert writes == []

    repo.transition(waiting[0].id, JobState.CANCELLED, reason="cancelled by user")
    loop.tick()
    positions = [repo.get(job.id).explanation or {} for job in waiting[1:]]
    assert [p.get("queue_position") for p in positions] == [1, 2]  # moved up at once
    assert writes == ["transition", "explain_waits"]  # the cancel, then one batch of notes


def test_a_place_deep_in_the_queue_is_rewritten_within_seconds_not_every_pass(
    repo: JobRepository, loop: SchedulerLoop, clock: Clock
) -> None:
    """Places near the head are exact at once; one within 10% of its stored value may lag
    up to 10 s, so a change at the head does not rewrite a whole queue every pass."""
    waiting = [submit(repo, dp=16) for _ in range(12)]  # never fit: only places move
    loop.tick()

    def places() -> list[int]:
        return [(repo.get(job.id).explanation or {})["queue_position"] for job in waiting]

    assert places() == list(range(1, 13))
    repo.transition(waiting[0].id, JobState.CANCELLED, reason="cancelled by user")
    waiting = waiting[1:]
    loop.tick()
    assert places()[:9] == list(range(1, 10))  # moved by more than 10%: at once
    assert places()[9:] == [11, 12]  # 11 -> 10 and 12 -> 11 are within 10%: may wait
    clock.now += timedelta(seconds=10)
    loop.tick()
    assert places() == list(range(1, 12))


def test_the_final_step_is_stored_before_the_job_is_seen_ended(
    repo: JobRepository,
    loop: SchedulerLoop,
    executor: FakeExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass stores its gangs' progress in one batch, but a report that ends the job has
    its step stored first: a client that sees SUCCEEDED sees step 10, not the last one
    batched before it."""
    job = submit(repo)
    loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=4)
    loop.tick()
    seen: list[int] = []
    transition = repo.transition

    def spy(job_id: int, new_state: JobState, **kwargs: Any) -> JobRecord:
        if new_state is JobState.SUCCEEDED:
            seen.append(repo.get(job_id).step)
        return transition(job_id, new_state, **kwargs)

    monkeypatch.setattr(repo, "transition", spy)
    executor.statuses[job.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=10)
    loop.tick()
    assert seen == [10]
    assert repo.get(job.id).step == 10


def test_a_fast_job_still_records_every_transition(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    job = submit(repo)
    loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=10)
    loop.tick()
    assert transitions(repo, job.id) == ["PENDING", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]


def test_waiting_jobs_get_a_reason_and_start_when_room_frees(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    big = submit(repo, dp=6)
    small = submit(repo, dp=4)
    loop.tick()
    assert repo.get(big.id).state is JobState.STARTING
    waiting = repo.get(small.id)
    assert waiting.state is JobState.PENDING
    assert waiting.status_reason.startswith("needs 4 GPUs; 2 free now; expected to start at")
    assert waiting.explanation is not None and waiting.explanation["blocker"] == "cluster_full"
    assert waiting.explanation["queue_position"] == 1
    assert waiting.estimated_start_at is not None

    executor.statuses[big.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=10)
    loop.tick()
    loop.tick()
    assert repo.get(small.id).state is JobState.STARTING


def test_cancel_in_the_store_tears_the_group_down(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    job = submit(repo)
    loop.tick()
    repo.transition(job.id, JobState.CANCELLED, reason="cancelled by user")
    loop.tick()
    assert executor.released == [job.id]
    assert repo.get(job.id).state is JobState.CANCELLED


def test_user_error_fails_the_job_with_the_traceback(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    job = submit(repo)
    loop.tick()
    error = "rank 1 failed:\nTraceback ...\nRuntimeError: boom"
    executor.statuses[job.id] = GroupStatus(GroupPhase.FAILED, True, error=error)
    loop.tick()
    failed = repo.get(job.id)
    assert failed.state is JobState.FAILED
    assert failed.error == error
    assert "RuntimeError: boom" in failed.status_reason


def test_failure_within_the_restart_budget_requeues_and_relaunches(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    job = submit(repo, max_restarts=1)
    loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.FAILED, True, error="actor died")
    loop.tick()
    loop.tick()
    again = repo.get(job.id)
    assert again.restarts == 1
    assert again.attempt == 2
    assert executor.launched[-1][:2] == (job.id, 2)
    assert transitions(repo, job.id)[-4:] == ["RESTARTING", "PENDING", "ADMITTED", "STARTING"]

    executor.statuses[job.id] = GroupStatus(GroupPhase.FAILED, True, error="actor died")
    loop.tick()
    assert repo.get(job.id).state is JobState.FAILED


def test_placement_timeout_requeues_without_holding_gpus(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    job = submit(repo)
    loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.PLACEMENT_TIMEOUT, error="no room in Ray")
    loop.tick()
    requeued = repo.get(job.id)
    assert executor.released == [job.id]
    assert requeued.placement is None
    assert "PENDING" in transitions(repo, job.id)[-2:]


def test_time_limit_fails_a_running_job(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    job = submit(repo, time_limit_s=60)
    loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    loop.tick()
    clock.now += timedelta(seconds=30)
    loop.tick()  # the same report again: judged quiet until the limit
    assert repo.get(job.id).state is JobState.RUNNING
    clock.now += timedelta(seconds=31)
    loop.tick()
    assert repo.get(job.id).state is JobState.FAILED
    assert repo.get(job.id).error == "time limit exceeded"


def test_reconcile_reattaches_running_jobs_and_requeues_lost_ones(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    alive, lost, starting = submit(repo), submit(repo), submit(repo)
    loop.tick()
    for job in (alive, lost):
        executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    loop.tick()
    restarted = FakeExecutor(attachable={alive.id})
    SchedulerLoop(repo=repo, cluster=FakeCluster(), executor=restarted).reconcile()
    assert repo.get(alive.id).state is JobState.RUNNING
    assert restarted.job_ids() == {alive.id}
    for job in (lost, starting):
        record = repo.get(job.id)
        assert record.state is JobState.PENDING
        assert "service restarted" in record.status_reason
        assert record.restarts == 0


def test_only_the_lease_holder_schedules_and_a_standby_takes_over(
    repo: JobRepository, clock: Clock
) -> None:
    leader_executor, standby_executor = FakeExecutor(), FakeExecutor()
    leader = make_loop(
        repo, leader_executor, clock, lease=LeaderLease(repo, ttl_s=3, holder="leader")
    )
    standby = make_loop(
        repo, standby_executor, clock, lease=LeaderLease(repo, ttl_s=3, holder="standby")
    )
    assert leader.lead() and not standby.lead()
    job = submit(repo)
    leader.tick()
    leader_executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    leader.tick()
    assert repo.get(job.id).state is JobState.RUNNING
    assert not standby.lead() and standby_executor.launched == []

    time.sleep(3.1)  # the leader stopped renewing (expiry is by the database's clock)
    standby_executor.attachable.add(job.id)
    assert standby.lead()  # took over: reconciled, so the running gang is reattached
    assert standby_executor.job_ids() == {job.id}
    assert repo.get(job.id).state is JobState.RUNNING and repo.get(job.id).attempt == 1
    assert not leader.lead()


def preempt_a_running_job(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> tuple[JobRecord, JobRecord]:
    """A low-priority gang fills the cluster; a high-priority one arrives an hour later."""
    low = submit(repo, dp=8, priority=0)
    loop.tick()
    executor.statuses[low.id] = GroupStatus(GroupPhase.RUNNING, True, step=5)
    loop.tick()
    clock.now += timedelta(hours=1)  # past the minimum runtime
    high = submit(repo, dp=4, priority=5)
    loop.tick()
    return low, high


def test_preemption_notice_then_requeue_then_the_preemptor_starts(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    low, high = preempt_a_running_job(repo, loop, executor, clock)
    victim = repo.get(low.id)
    assert victim.state is JobState.PREEMPTING
    assert victim.preempt_deadline is not None
    assert executor.stopped == [low.id]
    waiting = repo.get(high.id)
    assert waiting.explanation is not None and waiting.explanation["blocker"] == "preempting"

    loop.tick()  # still stopping: nothing changes, no second notice
    assert repo.get(low.id).state is JobState.PREEMPTING and executor.stopped == [low.id]

    executor.statuses[low.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=6)  # it stopped
    loop.tick()
    requeued = repo.get(low.id)
    assert requeued.state is JobState.PENDING
    assert "stopped at step 6 and requeued" in requeued.status_reason
    assert "(6 steps lost)" in requeued.status_reason
    loop.tick()
    assert repo.get(high.id).state is JobState.STARTING
    assert transitions(repo, low.id)[-3:] == ["RUNNING", "PREEMPTING", "PENDING"]


def test_a_victim_that_ignores_the_notice_is_killed_at_the_deadline(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    low, _ = preempt_a_running_job(repo, loop, executor, clock)
    loop.tick()
    assert repo.get(low.id).state is JobState.PREEMPTING
    clock.now += timedelta(minutes=10)
    loop.tick()
    assert repo.get(low.id).state is JobState.PENDING
    assert low.id in executor.released
    assert "killed at the deadline" in repo.get(low.id).status_reason


def counted(name: str, queue: str = "default") -> float:
    return metrics.REGISTRY.get_sample_value(name, {"queue": queue}) or 0.0


def test_the_requeue_reason_counts_steps_lost_since_the_checkpoint(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    preemptions, lost = counted("gangway_preemptions_total"), counted("gangway_lost_steps_total")
    low, _ = preempt_a_running_job(repo, loop, executor, clock)
    executor.statuses[low.id] = GroupStatus(
        GroupPhase.SUCCEEDED, True, step=9, checkpoint_step=7, stop_ack_s=1.3
    )
    loop.tick()
    reason = repo.get(low.id).status_reason
    assert (
        "stopped at step 9 (1.3 s after the notice) and requeued; resumes from its checkpoint "
        "at step 7" in reason
    )
    assert counted("gangway_preemptions_total") == preemptions + 1
    assert counted("gangway_lost_steps_total") == lost + 2
    assert "(2 steps lost)" in reason


def test_a_long_job_is_preempted_for_a_newcomer_of_its_priority_only_near_its_checkpoint(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    """Least attained service stops a long job for a newcomer of the same priority only
    while the stop loses at most `service_preemption_loss_s` (300 s) of work: the steps
    since the checkpoint rank 0 reported at the step time it measured (not the attempt's
    mean, 1 s here, which counts start-up and earlier attempts' steps). Before the store
    kept the reported checkpoint, every step of the attempt counted as lost, so a job
    past its first five minutes was never preempted for service."""
    long = submit(repo, dp=8, steps=100_000)
    loop.tick()
    executor.statuses[long.id] = GroupStatus(GroupPhase.RUNNING, True, step=1)
    loop.tick()
    clock.now += timedelta(hours=2)  # 16 GPU-hours attained: the lowest service band
    # a checkpoint 100 steps back but no measured step time: every step counts
    executor.statuses[long.id] = GroupStatus(
        GroupPhase.RUNNING, True, step=7200, checkpoint_step=7100
    )
    loop.tick()
    newcomer = submit(repo, dp=4)
    loop.tick()
    assert repo.get(long.id).state is JobState.RUNNING
    # 2,200 steps since the checkpoint x 0.25 s measured: 550 s would be lost
    executor.statuses[long.id] = GroupStatus(
        GroupPhase.RUNNING, True, step=7201, step_time_s=0.25, checkpoint_step=5001
    )
    loop.tick()
    loop.tick()
    assert repo.get(long.id).state is JobState.RUNNING and executor.stopped == []

    clock.now += timedelta(seconds=60)  # 760 steps x 0.25 s: 190 s (760 s at the mean)
    executor.statuses[long.id] = GroupStatus(
        GroupPhase.RUNNING, True, step=7260, step_time_s=0.25, checkpoint_step=6500
    )
    loop.tick()
    loop.tick()
    victim = repo.get(long.id)
    assert victim.state is JobState.PREEMPTING and executor.stopped == [long.id]
    assert f"preempted for job {newcomer.id}" in victim.status_reason
    assert "least attained service first" in victim.status_reason

    executor.statuses[long.id] = GroupStatus(
        GroupPhase.SUCCEEDED, True, step=7261, checkpoint_step=7261
    )
    loop.tick()
    loop.tick()
    executor.statuses[newcomer.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=10)
    loop.tick()
    loop.tick()
    resumed = repo.get(long.id)  # its next attempt starts with nothing measured
    assert resumed.attempt == 2 and resumed.state is not JobState.PENDING
    assert resumed.checkpoint_step is None and resumed.step_time_s is None


def test_queue_quotas_and_fair_share_reach_the_core(
    repo: JobRepository, executor: FakeExecutor, clock: Clock
) -> None:
    queues = QueueRepository(repo.engine)
    queues.put("small", QueueQuota(guaranteed_gpus=1, borrow_limit_gpus=1))
    loop = make_loop(repo, executor, clock, queues=queues.quotas)
    first = repo.create(
        NewJob(name="a", queue="small", priority=0, spec=SPEC, num_gpus=2, total_steps=10)
    )
    second = repo.create(
        NewJob(name="b", queue="small", priority=0, spec=SPEC, num_gpus=2, total_steps=10)
    )
    loop.tick()
    assert repo.get(first.id).state is JobState.STARTING
    blocked = repo.get(second.id)
    assert blocked.explanation is not None and blocked.explanation["blocker"] == "quota"
    queues.put("small", QueueQuota(guaranteed_gpus=4))  # an admin raises it: next pass
    loop.tick()
    assert repo.get(second.id).state is JobState.STARTING


def test_an_elastic_job_starts_at_the_degree_that_fits(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    blocker = submit(repo, dp=5)
    loop.tick()
    elastic = submit(repo, dp=2, parallelism={"dp": {"min": 1, "max": 8}, "tp": 1, "pp": 1})
    loop.tick()
    started = repo.get(elastic.id)
    assert started.state is JobState.STARTING
    assert started.placement is not None and len(started.placement) == 3
    assert group_spec(started).dp == 3
    assert blocker.id in executor.statuses


ELASTIC = {"dp": {"min": 2, "max": 8}, "tp": 1, "pp": 1}


def running_elastic_job(
    repo: JobRepository,
    loop: SchedulerLoop,
    executor: FakeExecutor,
    clock: Clock,
    *,
    blocker_dp: int,
) -> tuple[JobRecord, JobRecord]:
    """An elastic job (dp 2..8) running beside a blocker of `blocker_dp` GPUs, 4 steps
    into 1,000 at 10 s a step: a long way to go, so growing pays for its restart."""
    blocker = submit(repo, dp=blocker_dp)
    loop.tick()
    elastic = submit(repo, parallelism=ELASTIC, steps=1000)
    loop.tick()
    for job in (blocker, elastic):
        executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=0)
    loop.tick()
    clock.now += timedelta(seconds=40)
    for job in (blocker, elastic):
        executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=4)
    loop.tick()
    return blocker, repo.get(elastic.id)


def growing_elastic_job(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> JobRecord:
    """An elastic job at dp=3 whose blocker (dp=5) finished: it is RESIZING to dp=8."""
    blocker, elastic = running_elastic_job(repo, loop, executor, clock, blocker_dp=5)
    assert group_spec(elastic).dp == 3 and elastic.state is JobState.RUNNING
    executor.statuses[blocker.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=10)
    loop.tick()  # sees the blocker finish
    loop.tick()  # grows onto its GPUs
    return elastic


def test_an_elastic_job_grows_onto_freed_gpus_through_a_checkpoint(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    elastic = growing_elastic_job(repo, loop, executor, clock)
    resizing = repo.get(elastic.id)
    assert resizing.state is JobState.RESIZING
    assert resizing.placement is not None and len(resizing.placement) == 8  # held at once
    assert resizing.num_gpus == 8
    assert "grown from dp=3 to dp=8" in resizing.status_reason
    assert executor.stopped == [elastic.id]

    loop.tick()  # still saving: no relaunch yet
    assert repo.get(elastic.id).state is JobState.RESIZING
    executor.statuses[elastic.id] = GroupStatus(
        GroupPhase.SUCCEEDED, True, step=6, checkpoint_step=6
    )
    loop.tick()
    relaunched = repo.get(elastic.id)
    assert relaunched.state is JobState.STARTING and relaunched.attempt == 2
    assert executor.launched[-1] == (elastic.id, 2, relaunched.placement)
    assert group_spec(relaunched).dp == 8
    admitted = [e for e in repo.events(elastic.id) if e.to_state is JobState.ADMITTED][-1]
    assert admitted.reason == (
        "stopped at step 6; resumes from its checkpoint at step 6 (0 steps lost); "
        "relaunching at dp=8"
    )
    assert transitions(repo, elastic.id)[-4:] == ["RUNNING", "RESIZING", "ADMITTED", "STARTING"]


def test_an_elastic_job_shrinks_for_a_higher_priority_job_before_any_preemption(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    blocker, elastic = running_elastic_job(repo, loop, executor, clock, blocker_dp=2)
    assert group_spec(elastic).dp == 6
    high = submit(repo, dp=3, priority=5)
    loop.tick()
    shrinking = repo.get(elastic.id)
    assert shrinking.state is JobState.RESIZING and group_spec(shrinking).dp == 3
    assert repo.get(blocker.id).state is JobState.RUNNING  # nobody preempted
    waiting = repo.get(high.id)
    assert waiting.state is JobState.PENDING
    assert waiting.explanation is not None and waiting.explanation["blocker"] == "preempting"

    executor.statuses[elastic.id] = GroupStatus(
        GroupPhase.SUCCEEDED, True, step=9, checkpoint_step=9
    )
    loop.tick()
    assert repo.get(elastic.id).state is JobState.STARTING
    assert repo.get(high.id).state is JobState.STARTING


def test_a_resize_past_its_deadline_relaunches_from_the_previous_checkpoint(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    elastic = growing_elastic_job(repo, loop, executor, clock)
    executor.statuses[elastic.id] = GroupStatus(GroupPhase.RUNNING, True, step=7, checkpoint_step=5)
    clock.now += timedelta(minutes=10)
    loop.tick()
    relaunched = repo.get(elastic.id)
    assert relaunched.state is JobState.STARTING and relaunched.attempt == 2
    reason = repo.events(elastic.id)[-2].reason
    assert "killed at the deadline at step 7; resumes from its checkpoint at step 5" in reason
    assert "(2 steps lost)" in reason


def test_a_rank_that_crashes_while_resizing_fails_the_job(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    elastic = growing_elastic_job(repo, loop, executor, clock)
    executor.statuses[elastic.id] = GroupStatus(GroupPhase.FAILED, True, step=5, error="disk full")
    loop.tick()
    failed = repo.get(elastic.id)
    assert failed.state is JobState.FAILED and failed.error == "disk full"


def test_a_service_restart_mid_resize_reaps_the_old_gang_and_relaunches(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    elastic = growing_elastic_job(repo, loop, executor, clock)
    fresh = FakeExecutor()
    make_loop(repo, fresh, clock).reconcile()
    assert fresh.reaped == [(elastic.id, 1)]
    relaunched = repo.get(elastic.id)
    assert relaunched.state is JobState.STARTING and relaunched.attempt == 2
    assert fresh.launched == [(elastic.id, 2, relaunched.placement)]


def test_a_persistently_slow_rank_is_flagged_and_unflagged_in_events(
    repo: JobRepository, executor: FakeExecutor, clock: Clock
) -> None:
    loop = make_loop(repo, executor, clock, stragglers=StragglerWatch(window=3))
    job = submit(repo, dp=3)
    loop.tick()

    def steps(first: int, local_s: tuple[float, ...]) -> None:
        for step in range(first, first + 3):
            executor.statuses[job.id] = GroupStatus(
                GroupPhase.RUNNING, True, step=step, rank_local_s=local_s
            )
            loop.tick()

    steps(1, (0.10, 0.31, 0.11))
    flagged = repo.get(job.id)
    assert flagged.state is JobState.RUNNING
    assert flagged.stragglers == ({"rank": 1, "node_id": "id-1", "local_s": 0.31, "ratio": 2.82},)
    note = repo.events(job.id)[-1]
    assert note.from_state is note.to_state is JobState.RUNNING
    assert note.reason == (
        "straggler: rank 1 on local-1 needs 0.310 s of local work per step, 2.8x the "
        "gang's median (median over the last 3 polls)"
    )
    steps(4, (0.10, 0.31, 0.11))
    assert len(repo.events(job.id)) == 5  # still the same straggler: nothing new said
    steps(7, (0.10, 0.10, 0.11))
    assert repo.get(job.id).stragglers == ()
    assert repo.events(job.id)[-1].reason.startswith("no straggler")


def test_rank_0s_event_lines_become_job_events_once_even_after_a_restart(
    repo: JobRepository, executor: FakeExecutor, clock: Clock
) -> None:
    """What the trainer tells the job's owner (`RankContext.event`) lands in the job's
    events, state kept, each line once: not again on the next poll, nor when a restarted
    service (no memory of what it recorded) reads the same lines back from the gang."""
    loop = make_loop(repo, executor, clock)
    job = submit(repo, dp=2)
    loop.tick()
    split = "pipeline stages by measured cost: 0: embeddings + layers 0-3; 1: layers 4-5 + head"
    shares = "step 10: batch shares [4, 4] -> [5, 3] (rank speeds, samples/s: 12.6, 8.5)"

    def poll(the_loop: SchedulerLoop, step: int, *lines: str) -> list[str]:
        executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=step, events=lines)
        the_loop.tick()
        return [event.reason for event in repo.events(job.id)]

    assert poll(loop, 0, split).count(f"attempt 1: {split}") == 1  # before any step too
    assert poll(loop, 1, split).count(f"attempt 1: {split}") == 1
    reasons = poll(make_loop(repo, executor, clock), 10, split, shares)
    assert reasons.count(f"attempt 1: {split}") == 1
    assert reasons.count(f"attempt 1: {shares}") == 1
    last = repo.events(job.id)[-1]
    assert last.from_state is last.to_state is JobState.RUNNING


def _tick_across(
    loop: SchedulerLoop, clock: Clock, limit_s: float, unchanged: Callable[[], bool]
) -> None:
    """A pass 1 s before a limit `limit_s` from now, where nothing may have changed yet,
    and one 1 s after it."""
    clock.now += timedelta(seconds=limit_s - 1)
    loop.tick()
    assert unchanged()
    clock.now += timedelta(seconds=2)
    loop.tick()


def test_a_job_without_progress_is_hung_its_stacks_kept_and_it_restarts(
    repo: JobRepository, executor: FakeExecutor, clock: Clock
) -> None:
    loop = make_loop(
        repo, executor, clock, lifecycle=LifecycleConfig(hang_factor=10, hang_min_s=60)
    )
    job = submit(repo, max_restarts=1)
    loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=0)
    loop.tick()  # RUNNING, started now
    clock.now += timedelta(seconds=10)
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=5)
    loop.tick()  # 5 steps in 10 s: 2 s a step, so hung after max(60, 10 x 2) = 60 s
    _tick_across(loop, clock, 60, lambda: repo.get(job.id).state is JobState.RUNNING)
    hung = repo.get(job.id)
    assert hung.state is JobState.PENDING and hung.restarts == 1
    assert job.id in executor.released
    assert hung.error is not None and "stuck in job" in hung.error
    restarting = next(e for e in repo.events(job.id) if e.to_state is JobState.RESTARTING)
    assert "hung: no progress past step 5 for 61 s (limit 60 s" in restarting.reason


def test_a_gang_that_never_finishes_starting_is_hung_and_frees_its_gpus(
    repo: JobRepository, executor: FakeExecutor, clock: Clock
) -> None:
    """A rank that never gets ready (a package fetch or a supervisor that never answers)
    must not hold its GPUs for ever: past the start timeout from its admission the gang
    is released with its stacks kept, restarted, and failed once the budget is spent."""
    loop = make_loop(repo, executor, clock, lifecycle=LifecycleConfig(start_timeout_s=600))
    job = submit(repo, max_restarts=1)
    for attempt in (1, 2):
        loop.tick()  # admitted and launched: STARTING
        assert repo.get(job.id).state is JobState.STARTING
        assert executor.launched[-1][:2] == (job.id, attempt)
        executor.statuses[job.id] = GroupStatus(GroupPhase.RENDEZVOUS)
        _tick_across(loop, clock, 600, lambda: repo.get(job.id).state is JobState.STARTING)
    failed = repo.get(job.id)
    assert failed.state is JobState.FAILED and failed.restarts == 1
    assert executor.released == [job.id, job.id] and job.id not in executor.statuses
    assert failed.error is not None and "stuck in job" in failed.error
    reasons = [e.reason for e in repo.events(job.id)]
    assert any("restart 1 of 1: hung while starting" in r for r in reasons)
    assert "not every rank ready 601 s after admission (limit: start timeout 600 s" in reasons[-1]


def test_rank_output_reaches_the_store_once(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    job = submit(repo)
    loop.tick()
    lines = ((0, 1, "step 1/10 loss 5.5"), (1, 1, "rank 1 says hi"))
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=1, logs=lines)
    loop.tick()
    loop.tick()  # the fake hands out the same lines again: the store keeps one copy
    stored = [(x.attempt, x.rank, x.line) for x in repo.logs(job.id)]
    assert stored == [(1, 0, "step 1/10 loss 5.5"), (1, 1, "rank 1 says hi")]


def test_a_gang_that_lost_a_node_restarts_elsewhere(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor
) -> None:
    """Ray can report a dead node alive for a while; the loop does not wait to be told."""
    job = submit(repo, max_restarts=1)
    loop.tick()
    assert executor.launched[-1][2] == ("id-1", "id-1")
    executor.statuses[job.id] = GroupStatus(
        GroupPhase.FAILED, True, error="a rank's actor died (node id-1)", lost_nodes=("id-1",)
    )
    loop.tick()  # RESTARTING -> PENDING
    loop.tick()
    assert executor.launched[-1][:2] == (job.id, 2)
    assert executor.launched[-1][2] == ("id-2", "id-2")
    assert {n.name: n.alive for n in repo.nodes()} == {"local-1": False, "local-2": True}


def test_wake_ups_during_and_after_a_pass_make_one_pass_after_as_long_a_rest(
    loop: SchedulerLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream of submits wakes the loop all the time; each pass is followed by a rest as
    long as the pass, so the loop never holds more than half the CPU the API needs."""
    starts: list[float] = []

    def slow_tick() -> bool:
        starts.append(time.monotonic())
        time.sleep(0.2)
        return False

    monkeypatch.setattr(loop, "tick", slow_tick)
    stop, wake = threading.Event(), threading.Event()
    running = threading.Thread(target=loop.run, args=(stop, 10.0), kwargs={"wake": wake})
    running.start()
    try:
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            wake.set()  # a submit every 10 ms
            time.sleep(0.01)
    finally:
        stop.set()
        running.join(timeout=10)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) >= 1, "woken all the time, the loop made one pass in 2 s"
    assert min(gaps) >= 0.4 - 0.01  # a 0.2 s pass, then a 0.2 s rest


def test_gpu_types_reach_the_store_and_a_job_runs_on_the_type_it_names(
    repo: JobRepository, executor: FakeExecutor, clock: Clock
) -> None:
    typed = [
        Node("id-a", "a100-1", 4, 8.0, gpu_type="A100"),
        Node("id-h", "h100-1", 4, 8.0, gpu_type="H100"),
    ]
    loop = SchedulerLoop(repo=repo, cluster=FakeCluster(typed), executor=executor, clock=clock)
    named = submit(repo, resources={"gpus_per_rank": 1, "gpu_types": ["A100"]})
    anywhere = submit(repo)
    loop.tick()
    placed = {job_id: set(nodes) for job_id, _, nodes in executor.launched}
    assert placed == {named.id: {"id-a"}, anywhere.id: {"id-h"}}  # the fast type first
    stored = {n.name: (n.gpu_type, n.gpu_speed) for n in repo.nodes()}
    assert stored == {"a100-1": ("A100", 0.4), "h100-1": ("H100", 1.0)}
