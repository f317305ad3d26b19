"""Leases and fencing on SQLite and PostgreSQL: generations, the database's clock, and
writes refused to a leader that lost its lease."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session

from scheduler.model import JobState, Node
from scheduler.store import Fenced, FenceSlot, JobRepository, NewJob, StaleState
from scheduler.store.fencing import check_fence


def new_job() -> NewJob:
    spec = {"parallelism": {"dp": 1, "tp": 1, "pp": 1}, "entrypoint": {"kind": "builtin"}}
    return NewJob(name="j", queue="default", priority=0, spec=spec, num_gpus=1, total_steps=10)


def test_one_holder_at_a_time_and_every_takeover_a_new_generation(repo: JobRepository) -> None:
    leases = repo
    a = leases.hold_lease("scheduler", "a", ttl_s=0.6)
    assert a is not None and a.generation == 1
    assert leases.hold_lease("scheduler", "b", ttl_s=0.6) is None
    assert leases.hold_lease("scheduler", "a", ttl_s=0.6) == a  # a renewal keeps the generation
    time.sleep(0.8)  # a stopped renewing: expired by the database's clock
    b = leases.hold_lease("scheduler", "b", ttl_s=15)
    assert b is not None and b.generation == 2
    assert leases.hold_lease("scheduler", "a", ttl_s=15) is None
    leases.release_lease(a)  # not a's to give: nothing happens
    assert leases.hold_lease("scheduler", "a", ttl_s=15) is None
    leases.release_lease(b)
    again = leases.hold_lease("scheduler", "a", ttl_s=15)  # at once, no expiry wait
    assert again is not None and again.generation == 3


def test_expiry_is_judged_by_the_database_clock_not_the_hosts(repo: JobRepository) -> None:
    """A host whose clock runs an hour ahead stamps its rows with it; the lease does not
    care, since no host clock goes into it."""
    leases = repo.with_clock(lambda: datetime.now(UTC) + timedelta(hours=1))
    assert leases.hold_lease("scheduler", "a", ttl_s=15) is not None
    assert leases.hold_lease("scheduler", "b", ttl_s=15) is None


def test_a_stale_leader_writes_nothing_after_a_takeover(repo: JobRepository) -> None:
    leases = repo
    old = leases.hold_lease("scheduler", "old", ttl_s=0.3)
    assert old is not None
    stale = repo.fenced(FenceSlot(old))
    job = repo.create(new_job())
    admitted = stale.transition(
        job.id, JobState.ADMITTED, reason="old admits", placement=["n"], attempt=1
    )
    time.sleep(0.5)
    new = leases.hold_lease("scheduler", "new", ttl_s=15)
    assert new is not None and new.generation == old.generation + 1
    writes = [
        lambda: stale.transition(job.id, JobState.STARTING, reason="old starts"),
        lambda: stale.explain_wait(job.id, "old explains"),
        lambda: stale.append_logs(job.id, 1, [(0, 1, "old line")]),
        lambda: stale.replace_nodes([Node("n", "n", 1, 1.0)]),
        lambda: stale.annotate(job.id, "old annotates"),
    ]
    for write in writes:
        with pytest.raises(Fenced):
            write()
    assert repo.get(job.id) == admitted
    assert repo.logs(job.id) == []
    current = repo.fenced(FenceSlot(new)).transition(
        job.id, JobState.PENDING, reason="new requeues"
    )
    assert current.state is JobState.PENDING
    assert [e.reason for e in repo.events(job.id)] == ["submitted", "old admits", "new requeues"]
    with pytest.raises(Fenced, match="does not lead"):  # a loop standing by
        repo.fenced(FenceSlot()).explain_wait(job.id, "standby explains")


def test_an_action_needs_the_lease_for_its_whole_bound(repo: JobRepository) -> None:
    leases = repo
    fence = leases.hold_lease("scheduler", "a", ttl_s=2)
    assert fence is not None
    leases.check_lease(fence, valid_for_s=1)
    with pytest.raises(Fenced, match="expires in"):
        leases.check_lease(fence, valid_for_s=5)


def test_a_transition_meant_for_one_attempt_never_lands_on_the_next(repo: JobRepository) -> None:
    job = repo.create(new_job())
    repo.transition(job.id, JobState.ADMITTED, reason="a", placement=["n"], attempt=1)
    repo.transition(job.id, JobState.PENDING, reason="requeued", placement=None)
    repo.transition(job.id, JobState.ADMITTED, reason="b", placement=["n"], attempt=2)
    with pytest.raises(StaleState, match="attempt 2, not 1"):
        repo.transition(
            job.id,
            JobState.STARTING,
            reason="late",
            expected=JobState.ADMITTED,
            expected_attempt=1,
        )
    assert repo.get(job.id).state is JobState.ADMITTED


@pytest.mark.postgres
def test_a_takeover_waits_for_the_old_leaders_write_in_flight(postgres_url: str) -> None:
    """PostgreSQL: the fence check locks the lease row for share, so the new leader's
    takeover commits only after the old leader's transaction, never in its middle."""
    from scheduler.store import make_engine, upgrade_to_head

    upgrade_to_head(postgres_url)
    engine = make_engine(postgres_url)
    leases = JobRepository(engine)
    old = leases.hold_lease("scheduler", "old", ttl_s=0.2)
    assert old is not None
    time.sleep(0.3)
    taken: list[float] = []
    with Session(engine) as session, session.begin():
        check_fence(session, old)  # the old leader's write transaction, still open
        thread = threading.Thread(
            target=lambda: (
                taken.append(time.monotonic())
                if leases.hold_lease("scheduler", "new", ttl_s=15)
                else None
            )
        )
        thread.start()
        time.sleep(0.5)
        assert taken == []  # blocked on the share lock
        committed_at = time.monotonic()
    thread.join(timeout=10)
    assert taken and taken[0] >= committed_at
    engine.dispose()
