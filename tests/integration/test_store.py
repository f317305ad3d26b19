"""The repository on SQLite and PostgreSQL: transitions, events, paging, migrations."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from scheduler.model import JobState, Node
from scheduler.store import (
    IllegalTransition,
    JobNotFound,
    JobRepository,
    KeyReused,
    NewJob,
    ProgressPoint,
    StaleState,
)
from scheduler.store.tables import Base


def new_job(name: str = "j", priority: int = 0) -> NewJob:
    spec = {"parallelism": {"dp": 1, "tp": 1, "pp": 1}, "entrypoint": {"kind": "builtin"}}
    return NewJob(
        name=name, queue="default", priority=priority, spec=spec, num_gpus=1, total_steps=10
    )


def test_migration_matches_the_tables(repo: JobRepository, database_url: str) -> None:
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_create_writes_a_pending_job_and_its_first_event(repo: JobRepository) -> None:
    job = repo.create(new_job())
    assert job.state is JobState.PENDING
    assert job.submitted_at.tzinfo is not None
    (event,) = repo.events(job.id)
    assert (event.from_state, event.to_state, event.reason) == (None, JobState.PENDING, "submitted")


def test_transition_sets_fields_timestamps_and_an_event(repo: JobRepository) -> None:
    job = repo.create(new_job())
    admitted = repo.transition(
        job.id, JobState.ADMITTED, reason="fits", expected=JobState.PENDING, placement=["a", "b"]
    )
    assert admitted.state is JobState.ADMITTED
    assert admitted.placement == ("a", "b")
    assert admitted.admitted_at is not None
    assert admitted.status_reason == "fits"
    assert [e.to_state for e in repo.events(job.id)] == [JobState.PENDING, JobState.ADMITTED]


def test_transition_refuses_illegal_edges_and_stale_expectations(repo: JobRepository) -> None:
    job = repo.create(new_job())
    with pytest.raises(IllegalTransition):
        repo.transition(job.id, JobState.SUCCEEDED, reason="no")
    with pytest.raises(StaleState):
        repo.transition(job.id, JobState.STARTING, reason="no", expected=JobState.ADMITTED)
    repo.transition(job.id, JobState.CANCELLED, reason="user")
    with pytest.raises(IllegalTransition):
        repo.transition(job.id, JobState.CANCELLED, reason="again")
    assert len(repo.events(job.id)) == 2
    with pytest.raises(JobNotFound):
        repo.transition(999_999, JobState.CANCELLED, reason="x")


def test_page_is_newest_first_filtered_and_cursor_paginated(repo: JobRepository) -> None:
    ids = [repo.create(new_job(f"j{i}")).id for i in range(5)]
    repo.transition(ids[1], JobState.CANCELLED, reason="x")
    first = repo.page(limit=2)
    assert [j.id for j in first] == [ids[4], ids[3]]
    second = repo.page(limit=2, before_id=first[-1].id)
    assert [j.id for j in second] == [ids[2], ids[1]]
    assert [j.id for j in repo.page(states=[JobState.CANCELLED])] == [ids[1]]


def test_progress_keeps_the_first_loss(repo: JobRepository) -> None:
    job = repo.create(new_job())
    repo.record_progress(job.id, 1, ProgressPoint(3, loss=5.0, first_loss=5.5, tokens_per_s=100.0))
    repo.record_progress(job.id, 1, ProgressPoint(4, loss=4.0, first_loss=4.8, tokens_per_s=120.0))
    got = repo.get(job.id)
    assert (got.step, got.loss, got.first_loss, got.tokens_per_s) == (4, 4.0, 5.5, 120.0)


def test_explain_wait_updates_pending_jobs_only(repo: JobRepository) -> None:
    job = repo.create(new_job())
    repo.explain_wait(job.id, "needs 8 GPUs")
    assert repo.get(job.id).status_reason == "needs 8 GPUs"
    repo.transition(job.id, JobState.CANCELLED, reason="cancelled by user")
    repo.explain_wait(job.id, "needs 8 GPUs")
    assert repo.get(job.id).status_reason == "cancelled by user"


def test_replace_nodes(repo: JobRepository) -> None:
    repo.replace_nodes([Node("b", "node-b", 4, 8.0), Node("a", "node-a", 4, 8.0, alive=False)])
    assert [n.name for n in repo.nodes()] == ["node-a", "node-b"]
    repo.replace_nodes([Node("c", "node-c", 8, 16.0, rack="r2")])
    assert [(n.id, n.rack) for n in repo.nodes()] == [("c", "r2")]


def test_upgrade_from_0001_keeps_jobs_and_fills_the_user(database_url: str) -> None:
    from alembic import command

    from scheduler.store.migrate import alembic_config

    command.upgrade(alembic_config(database_url), "0001")
    engine = sa.create_engine(database_url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (name, queue, priority, state, spec, num_gpus, submitted_at, "
                "updated_at, status_reason, attempt, restarts, step) VALUES ('old', 'q', 0, "
                "'PENDING', '{}', 1, :now, :now, '', 0, 0, 0)"
            ),
            {"now": now},
        )
    command.upgrade(alembic_config(database_url), "head")
    with engine.connect() as conn:
        assert conn.execute(sa.text('SELECT name, "user" FROM jobs')).one() == ("old", "default")
    engine.dispose()


def test_usage_intervals_cover_running_and_recent_jobs(repo: JobRepository) -> None:
    a, b, _never_started = (repo.create(new_job(n)) for n in "abc")
    for job in (a, b):
        repo.transition(job.id, JobState.ADMITTED, reason="t", placement=["n"])
        repo.transition(job.id, JobState.STARTING, reason="t")
        repo.transition(job.id, JobState.RUNNING, reason="t")
    repo.transition(b.id, JobState.SUCCEEDED, reason="t")
    intervals = repo.usage_intervals(datetime.now(UTC) - timedelta(hours=1))
    assert sorted((i.gpus, i.end is None) for i in intervals) == [(1, False), (1, True)]
    assert repo.usage_intervals(datetime.now(UTC) + timedelta(hours=1))[0].end is None


def test_transitions_bank_waits_and_attained_gpu_seconds(repo: JobRepository) -> None:
    """What least attained service ranks by: every queue period and every run, summed."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    now = [start]
    clocked = repo.with_clock(lambda: now[0])
    job = clocked.create(replace(new_job(), num_gpus=4))
    steps = [  # (seconds later, new state)
        (10, JobState.ADMITTED),  # waited 10 s
        (1, JobState.STARTING),
        (1, JobState.RUNNING),
        (100, JobState.PREEMPTING),  # the run goes on while it checkpoints ...
        (5, JobState.PENDING),  # ... and ends here: 105 s x 4 GPUs
        (20, JobState.ADMITTED),  # waited 20 s more
        (1, JobState.STARTING),
        (1, JobState.RUNNING),
        (50, JobState.SUCCEEDED),  # 50 s x 4 GPUs
    ]
    for seconds, state in steps:
        now[0] += timedelta(seconds=seconds)
        placement = {"placement": ["n"] * 4} if state is JobState.ADMITTED else {}
        record = clocked.transition(job.id, state, reason="t", **placement)
        if state is JobState.PENDING:
            assert record.queued_at == now[0]
    assert (record.waited_s, record.attained_gpu_s) == (30.0, 155.0 * 4)
    assert record.queued_at == start + timedelta(seconds=117)


def test_logs_are_kept_per_attempt_and_rank_without_repeats(repo: JobRepository) -> None:
    job = repo.create(new_job())
    assert repo.append_logs(job.id, 1, [(0, 1, "a0"), (1, 1, "b0"), (0, 2, "a1")]) == 3
    # a group reattached after a service restart sends its buffer again: nothing repeats
    assert repo.append_logs(job.id, 1, [(0, 1, "a0"), (0, 2, "a1"), (0, 3, "a2")]) == 1
    assert repo.append_logs(job.id, 2, [(0, 1, "second attempt")]) == 1
    assert [(x.attempt, x.rank, x.seq, x.line) for x in repo.logs(job.id)] == [
        (1, 0, 1, "a0"),
        (1, 1, 1, "b0"),
        (1, 0, 2, "a1"),
        (1, 0, 3, "a2"),
        (2, 0, 1, "second attempt"),
    ]
    assert [x.line for x in repo.logs(job.id, rank=1)] == ["b0"]
    assert [x.line for x in repo.logs(job.id, tail=2)] == ["a2", "second attempt"]
    with pytest.raises(JobNotFound):
        repo.logs(job.id + 100)


def test_one_holder_at_a_time_holds_a_lease_until_it_expires(repo: JobRepository) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    clocked = repo.with_clock(lambda: now[0])
    assert clocked.hold_lease("scheduler", "a", ttl_s=15)
    assert not clocked.hold_lease("scheduler", "b", ttl_s=15)
    now[0] += timedelta(seconds=10)
    assert clocked.hold_lease("scheduler", "a", ttl_s=15)  # renewed until t=25
    now[0] += timedelta(seconds=14)
    assert not clocked.hold_lease("scheduler", "b", ttl_s=15)
    now[0] += timedelta(seconds=2)  # a stopped renewing: expired at t=25
    assert clocked.hold_lease("scheduler", "b", ttl_s=15)
    assert not clocked.hold_lease("scheduler", "a", ttl_s=15)
    clocked.release_lease("scheduler", "a")  # not a's to give: nothing happens
    assert not clocked.hold_lease("scheduler", "a", ttl_s=15)
    clocked.release_lease("scheduler", "b")
    assert clocked.hold_lease("scheduler", "a", ttl_s=15)  # at once, no expiry wait


def test_create_once_returns_the_first_job_for_a_key(repo: JobRepository) -> None:
    keyed = replace(new_job(), idempotency_key="k1", request_digest="d1")
    first, created = repo.create_once(keyed)
    again, created_again = repo.create_once(keyed)
    assert (created, created_again, again.id) == (True, False, first.id)
    with pytest.raises(KeyReused):
        repo.create_once(replace(keyed, request_digest="d2"))
    other, _ = repo.create_once(replace(new_job(), idempotency_key="k2", request_digest="d1"))
    assert other.id != first.id
