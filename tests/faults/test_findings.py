"""Issue 15's findings, one test each, that also run against the commit they were found on
(e1c70d8) and fail there: only APIs both versions have are used (the loop with the fakes
of tests/integration/test_loop.py, each version's own; `Checkpointer`; the REST API).
Fast: a real database, no Ray."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from fastapi.testclient import TestClient
from torch import nn

from api.app import create_app
from scheduler.model import JobState, Node
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.loop import SchedulerLoop
from scheduler.store import JobRecord, JobRepository, NewJob
from tests.integration.test_loop import FakeCluster, FakeExecutor, submit
from workers.engine.checkpoint import Checkpointer

pytestmark = pytest.mark.faults

BUILTIN: dict[str, Any] = {"name": "j", "entrypoint": {"kind": "builtin", "steps": 5}}


@dataclass
class SlowLaunch(FakeExecutor):
    """A launch that takes `delay_s` (a Ray call stuck that long) before it is recorded."""

    delay_s: float = 0.0

    def launch(self, job: JobRecord) -> None:
        time.sleep(self.delay_s)
        super().launch(job)


def loop_for(
    repo: JobRepository, holder: str, ttl_s: float, executor: FakeExecutor
) -> SchedulerLoop:
    lease = LeaderLease(repo, ttl_s=ttl_s, holder=holder)
    return SchedulerLoop(repo=repo, cluster=FakeCluster(), executor=executor, lease=lease)


def in_thread(target: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # the thread's outcome, checked by the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


# -- 2. two leaders at once -----------------------------------------------------------


def test_a_stale_leaders_write_never_lands_on_the_new_leaders_attempt(
    repo: JobRepository,
) -> None:
    """Finding 2: A admits a job and its launch hangs past A's lease. B takes over,
    requeues the job and admits attempt 2; B's own launch is slow too. A wakes while the
    job is ADMITTED at attempt 2: its ADMITTED -> STARTING must not land (on e1c70d8 the
    transition compares the state only, so A moves B's attempt to STARTING)."""
    old_executor, new_executor = SlowLaunch(delay_s=4.0), SlowLaunch(delay_s=8.0)
    old = loop_for(repo, "old", 1.0, old_executor)
    new = loop_for(repo, "new", 30.0, new_executor)
    assert old.lead()
    job = submit(repo)
    stalled, _ = in_thread(old.tick)
    deadline = time.monotonic() + 5.0
    while repo.get(job.id).state is not JobState.ADMITTED:  # A admitted it: in its launch
        assert time.monotonic() < deadline, "A never admitted the job"
        time.sleep(0.05)
    deadline = time.monotonic() + 5.0  # A's launch guard may renew once, for a TTL
    while not new.lead():  # takes over once A's lease expires, and reconciles
        assert time.monotonic() < deadline, "A's lease never expired"
        time.sleep(0.1)
    launching, new_errors = in_thread(new.tick)
    deadline = time.monotonic() + 5.0
    while ((got := repo.get(job.id)).state, got.attempt) != (JobState.ADMITTED, 2):
        assert time.monotonic() < deadline, "B never admitted attempt 2"
        time.sleep(0.05)
    assert stalled.is_alive(), "A woke before B admitted attempt 2: nothing to prove"
    stalled.join(timeout=20)
    assert not stalled.is_alive()
    assert launching.is_alive(), "B's launch ended early: the check below would prove nothing"
    record = repo.get(job.id)
    print(
        "after A woke:",
        record.state,
        "attempt",
        record.attempt,
        [e.reason for e in repo.events(job.id)],
    )
    assert (record.state, record.attempt) == (JobState.ADMITTED, 2), (
        f"the stale leader's write landed on attempt {record.attempt}: {record.state}"
    )
    launching.join(timeout=30)
    assert new_errors == [] and repo.get(job.id).state is JobState.STARTING
    assert not old.lead() and old_executor.job_ids() == set()  # A stands by, holding nothing


def test_a_host_whose_clock_is_behind_cannot_let_a_standby_in_early(
    repo: JobRepository,
) -> None:
    """Finding 2: lease expiry used each host's clock. A leader whose clock runs an hour
    behind stamped an expiry already past for everyone else: a standby took over at once
    while the leader was alive (two leaders). Judged by the database's clock, it cannot."""
    behind = repo.with_clock(lambda: datetime.now(UTC) - timedelta(hours=1))
    leader = loop_for(behind, "leader", 15, FakeExecutor())
    standby = loop_for(repo, "standby", 15, FakeExecutor())
    assert leader.lead()
    assert not standby.lead(), "the standby took a lease renewed a moment ago"
    assert leader.lead()


def test_a_pass_stuck_past_the_ttl_does_not_let_a_standby_in(repo: JobRepository) -> None:
    """Finding 2: the lease was renewed only at the top of a pass, so one pass stuck
    longer than the TTL (here a launch hanging 3 TTLs) let a standby take over while the
    leader was alive and about to write. The lease is renewed independently of passes."""
    leader = loop_for(repo, "leader", 1.0, SlowLaunch(delay_s=3.0))
    standby = loop_for(repo, "standby", 1.0, FakeExecutor())
    stop, wake = threading.Event(), threading.Event()
    running, errors = in_thread(lambda: leader.run(stop, interval_s=0.2, wake=wake))
    try:
        deadline = time.monotonic() + 10
        time.sleep(0.5)  # the leader holds the lease
        job = submit(repo)
        wake.set()
        while repo.get(job.id).state is not JobState.ADMITTED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert repo.get(job.id).state is JobState.ADMITTED  # the leader is in its launch
        stuck_until = time.monotonic() + 2.5
        while time.monotonic() < stuck_until:
            assert not standby.lead(), "a standby took over from a live leader in a long pass"
            time.sleep(0.2)
    finally:
        stop.set()
        wake.set()
        running.join(timeout=15)
    assert errors == []


def test_log_lines_are_indexed_by_job_and_seq(repo: JobRepository) -> None:
    """Finding 4: `append_logs` takes max(seq) over a job's lines on every poll, and no
    index covered (job_id, seq): each poll scanned every line the job ever printed."""
    indexes = sa.inspect(repo.engine).get_indexes("job_logs")
    covering = [
        i["name"]
        for i in indexes
        if i["column_names"][:1] == ["job_id"] and "seq" in i["column_names"]
    ]
    assert covering, f"job_logs indexes: {[(i['name'], i['column_names']) for i in indexes]}"


# -- 1. stranded gangs after a restart ------------------------------------------------


def test_a_takeover_reaps_what_no_active_attempt_owns(repo: JobRepository) -> None:
    """Finding 1: after a restart the new leader holds no handle. A gang that was
    ADMITTED or STARTING is requeued, and its placement group and actors (detached, named
    per job and attempt) must be reaped by name; so must any Gangway gang on Ray that no
    active (job, attempt) owns. On e1c70d8 requeueing only released a handle it did not
    have, and nothing swept."""
    first_executor = FakeExecutor()
    first = loop_for(repo, "first", 1.0, first_executor)
    assert first.lead()
    running, starting = submit(repo), submit(repo)
    first.tick()
    first_executor.statuses[running.id] = GroupStatus(GroupPhase.RUNNING, True, step=3)
    first.tick()
    assert repo.get(running.id).state is JobState.RUNNING
    assert repo.get(starting.id).state is JobState.STARTING
    time.sleep(1.3)  # the first leader is gone (killed): its lease expires

    executor = FakeExecutor()
    executor.attachable.add(running.id)
    executor.on_ray = {(running.id, 1), (running.id, 0), (starting.id, 1), (999, 3)}
    second = loop_for(repo, "second", 15, executor)
    assert second.lead()
    assert repo.get(running.id).state is JobState.RUNNING
    assert repo.get(starting.id).state is JobState.PENDING
    assert (starting.id, 1) in executor.reaped, f"attempt 1 left on Ray: {executor.reaped}"
    assert set(executor.reaped) == {(starting.id, 1), (running.id, 0), (999, 3)}


# -- 3. checkpoints destroyed in place ------------------------------------------------


def checkpointer(directory: Path) -> Checkpointer:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    return Checkpointer(directory, [model], [torch.optim.AdamW(model.parameters())], keep_last=2)


@pytest.mark.filterwarnings("ignore:Detected an existing checkpoint")  # e1c70d8 overwrites
def test_a_save_at_a_step_that_has_a_checkpoint_leaves_it_untouched(tmp_path: Path) -> None:
    """Finding 3: a job stopped right after resuming saves again at the step it resumed
    from. On e1c70d8 that rewrote the shards under the existing `.metadata` (a kill then
    left a checkpoint that counts as complete and cannot be loaded)."""
    ranks = checkpointer(tmp_path)
    saved = ranks.save(120, sample=7)
    assert saved is not None
    before = {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in saved.iterdir()}
    with torch.no_grad():
        for parameter in ranks.parts[0].parameters():
            parameter.add_(1.0)  # state that would differ if it were written again
    time.sleep(0.05)  # a rewrite gets a later mtime
    ranks.save(120, sample=99)
    after = {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in saved.iterdir()}
    assert after == before, "the complete checkpoint at step 120 was written over"
    fresh = checkpointer(tmp_path)
    assert fresh.load_latest("sample") == 120 and fresh.counters == {"sample": 7}


def test_junk_in_the_checkpoint_directory_does_not_break_the_listing(
    repo: JobRepository, tmp_path: Path
) -> None:
    """Finding 3: a junk `step-*` directory made the listing and the job summary 500."""
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    root = tmp_path / "checkpoints"
    with TestClient(create_app(repo, checkpoint_root=root), raise_server_exceptions=False) as api:
        job_id = api.post("/v1/jobs", json=BUILTIN).json()["id"]
        directory = root / f"job-{job_id}"
        for name in ("step-00000010", "step-abc"):
            (directory / name).mkdir(parents=True)
            (directory / name / "__0_0.distcp").write_bytes(b"x" * 10)
            (directory / name / ".metadata").write_bytes(b"m")
        listed = api.get(f"/v1/jobs/{job_id}/checkpoints")
        assert listed.status_code == 200, listed.text[:300]
        assert [c["step"] for c in listed.json()["checkpoints"]] == [10]
        assert api.get(f"/ui/jobs/{job_id}/summary").status_code == 200


# -- 4. no limits ---------------------------------------------------------------------


def test_request_sizes_are_limited_with_clear_errors(repo: JobRepository) -> None:
    """Finding 4: a 2 MB kwargs body, a 20 kB kwargs object, a 5,000-character script
    argument and a NUL in a name were all accepted on e1c70d8 (or failed with a 500 on
    PostgreSQL): 413 and 422s naming the field, with the service's default limits."""
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    with TestClient(create_app(repo), raise_server_exceptions=False) as api:

        def answer(entrypoint: dict[str, Any], **fields: Any) -> tuple[int, str | None]:
            response = api.post("/v1/jobs", json={**BUILTIN, "entrypoint": entrypoint, **fields})
            field = (response.json().get("error") or {}).get("field")
            return response.status_code, field

        function = {"kind": "function", "target": "workers.examples:check_mesh"}
        huge = {**function, "kwargs": {"blob": "x" * 2_000_000}}
        assert answer(huge)[0] == 413
        big = {**function, "kwargs": {"blob": "x" * 20_000}}
        assert answer(big) == (422, "entrypoint.kwargs")
        script = {"kind": "script", "path": "/bin/true", "args": ["ok", "y" * 5000]}
        assert answer(script) == (422, "entrypoint.args.1")
        assert answer(BUILTIN["entrypoint"], name="bad\x00name") == (422, "name")


def test_a_listing_page_stays_within_the_byte_budget(repo: JobRepository) -> None:
    """Finding 4: `?limit=500` returned every stored spec whole (25 MB after 20 MB
    bodies). With the default budget (2 MiB) a page ends early and names a cursor."""
    spec = {**BUILTIN, "entrypoint": {"kind": "function", "target": "a.b:c"}}
    spec["entrypoint"]["kwargs"] = {"blob": "x" * 15_000}  # under the 16 KiB kwargs limit
    new = NewJob(name="j", queue="default", priority=0, spec=spec, num_gpus=1, total_steps=1)
    ids = [repo.create(new).id for _ in range(200)]  # ~3 MB of specs
    with TestClient(create_app(repo), raise_server_exceptions=False) as api:
        first = api.get("/v1/jobs", params={"limit": 500})
        assert first.status_code == 200
        assert len(first.content) < 2 * 1024 * 1024 + 400_000, len(first.content)
        page = first.json()
        assert page["next_cursor"] is not None and len(page["items"]) < len(ids)
