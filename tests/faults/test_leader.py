"""Leader faults on a real database, with fakes at the Ray seam (fast, no Ray): a pass
stalled past the lease TTL, a leader paused while a standby takes over, and what a
takeover reaps."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from scheduler.model import JobState, Node
from scheduler.runtime.cluster import DriverNodeLost
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.loop import SchedulerLoop
from scheduler.store import Fenced, FenceSlot, JobRepository
from tests.integration.test_loop import FakeCluster, FakeExecutor, submit
from workers import faults

pytestmark = pytest.mark.faults


@pytest.fixture
def inject(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Configure `workers.faults` for this process, as GANGWAY_FAULTS would."""

    def configure(text: str) -> None:
        monkeypatch.setattr(faults, "_faults", faults.parse(text))
        monkeypatch.setattr(faults, "_seen", faults.Counter())

    yield configure


def loop_for(repo: JobRepository, holder: str, ttl_s: float) -> tuple[SchedulerLoop, FakeExecutor]:
    executor = FakeExecutor()
    lease = LeaderLease(repo, ttl_s=ttl_s, holder=holder)
    loop = SchedulerLoop(repo=repo, cluster=FakeCluster(), executor=executor, lease=lease)
    return loop, executor


def event_generations(repo: JobRepository, job_id: int) -> list[tuple[str, int | None]]:
    with repo.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT to_state, generation FROM job_events WHERE job_id = :id ORDER BY id"),
            {"id": job_id},
        )
        return [(str(state), generation) for state, generation in rows]


def test_a_stale_leader_changes_nothing_after_the_takeover(
    repo: JobRepository, inject: object
) -> None:
    """Leader A admits a job, then pauses (heartbeat and pass alike, like a frozen
    process) past its TTL between admitting and launching. B takes over: it requeues the
    job (reaping attempt 1 by name) and launches attempt 2. When A wakes, its launch and
    its ADMITTED -> STARTING are refused: nothing A does after the takeover lands."""
    inject("scheduler.launch:sleep=2.5@1")  # A's first launch only
    old, old_executor = loop_for(repo, "old", ttl_s=1.0)
    new, new_executor = loop_for(repo, "new", ttl_s=1.0)
    assert old.lead()
    job = submit(repo)
    errors: list[BaseException] = []

    def old_pass() -> None:
        try:
            old.tick()
        except BaseException as exc:  # the thread's outcome, checked below
            errors.append(exc)

    stalled = threading.Thread(target=old_pass)
    stalled.start()
    time.sleep(1.4)  # A's lease expires (by the database's clock) while it sleeps
    assert new.lead()  # takes over: generation 2, reconciles
    new.tick()
    stalled.join(timeout=10)

    assert len(errors) == 1 and isinstance(errors[0], Fenced), errors
    assert old_executor.launched == []  # A never reached Ray
    assert new_executor.reaped[0] == (job.id, 1)  # attempt 1 reaped by name
    assert [(j, a) for j, a, _ in new_executor.launched] == [(job.id, 2)]
    record = repo.get(job.id)
    assert (record.state, record.attempt) == (JobState.STARTING, 2)
    events = event_generations(repo, job.id)
    print("events (state, generation):", events)
    first_new = next(i for i, (_, g) in enumerate(events) if g == 2)
    assert all(g == 2 for _, g in events[first_new:]), events  # none of A's after B's first
    assert new.lead()  # B renews (no heartbeat thread here)
    assert not old.lead() and old_executor.job_ids() == set()  # A stands by, handles dropped


def test_a_pass_stalled_past_the_ttl_keeps_the_lease(repo: JobRepository, inject: object) -> None:
    """The heartbeat renews from its own thread: a pass stalled for 2.5 TTLs between
    deciding and writing does not let a standby in, and its writes land."""
    inject("scheduler.decided:sleep=2.5@1")
    leader, executor = loop_for(repo, "leader", ttl_s=1.0)
    standby, standby_executor = loop_for(repo, "standby", ttl_s=1.0)
    leader._leadership.start()  # the heartbeat thread, as `run` starts it
    try:
        assert leader.lead()
        job = submit(repo)
        stalled = threading.Thread(target=leader.tick)
        stalled.start()
        while stalled.is_alive():
            assert not standby.lead()
            time.sleep(0.2)
        stalled.join()
        assert repo.get(job.id).state is JobState.STARTING
        assert [j for j, _, _ in executor.launched] == [job.id]
        assert standby_executor.launched == []
    finally:
        leader._leadership.step_down()


def test_a_late_heartbeat_does_not_fence_a_leader_that_still_holds_its_lease(
    repo: JobRepository,
) -> None:
    """A heartbeat late by a little leaves the lease short of the bound an action needs
    but still the leader's: the action renews it under the same generation and goes on
    (it failed a CI run at 0.30 s left of the 0.33 s needed). Once another holder has
    taken the lease, the same action is refused."""
    lease = LeaderLease(repo, ttl_s=1.0, holder="late")
    slot = FenceSlot(lease.renew())
    time.sleep(0.8)  # 0.2 s left, less than action_bound_s (0.33 s)
    lease.guard(slot)
    assert slot.require().generation == 1
    time.sleep(1.1)  # expired; a standby takes it
    assert LeaderLease(repo, ttl_s=1.0, holder="standby").renew() is not None
    with pytest.raises(Fenced):
        lease.guard(slot)


def test_a_takeover_reaps_what_no_active_attempt_owns(repo: JobRepository) -> None:
    """Reconcile reattaches the running gang and requeues the starting one; the sweep
    then tears down every Gangway gang on Ray without an active (job, attempt): the
    starting job's attempt, an old attempt of the running job, and a stray job's."""
    first, first_executor = loop_for(repo, "first", ttl_s=15)
    assert first.lead()
    running, starting = submit(repo), submit(repo)
    first.tick()
    first_executor.statuses[running.id] = GroupStatus(GroupPhase.RUNNING, True, step=3)
    first.tick()
    assert repo.get(running.id).state is JobState.RUNNING
    assert repo.get(starting.id).state is JobState.STARTING
    first._leadership.step_down()

    second, executor = loop_for(repo, "second", ttl_s=15)
    executor.attachable.add(running.id)
    executor.on_ray = {(running.id, 1), (running.id, 0), (starting.id, 1), (999, 3)}
    assert second.lead()
    assert repo.get(running.id).state is JobState.RUNNING
    assert repo.get(starting.id).state is JobState.PENDING
    assert executor.on_ray == {(running.id, 1)}
    assert set(executor.reaped) == {(starting.id, 1), (running.id, 0), (999, 3)}


def test_a_service_whose_ray_node_is_declared_dead_steps_down_and_stops(
    repo: JobRepository,
) -> None:
    """Its raylet has exited (a partition between the service's host and Ray's head):
    the loop ends, hands the reason to the service (which exits to be restarted) and
    gives up the lease, so a standby leads at once instead of a TTL later."""

    class LostNode(FakeCluster):
        def nodes(self) -> list[Node]:
            raise DriverNodeLost("the Ray head declared this service's node dead")

    lease = LeaderLease(repo, ttl_s=30.0, holder="cut-off")
    loop = SchedulerLoop(repo=repo, cluster=LostNode(), executor=FakeExecutor(), lease=lease)
    told: list[BaseException] = []
    runner = threading.Thread(
        target=loop.run, args=(threading.Event(), 0.05), kwargs={"fatal": told.append}
    )
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive() and len(told) == 1
    assert isinstance(told[0], DriverNodeLost)
    assert LeaderLease(repo, ttl_s=30.0, holder="standby").renew() is not None
