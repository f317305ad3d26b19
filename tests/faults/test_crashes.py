"""A service killed with SIGKILL in every state a gang can be in, on an external Ray (the
ranks outlive the service, the production shape); a rank SIGKILLed; a rank's supervisor
stuck (SIGSTOP); a rank killed in the middle of a checkpoint save. Each case ends with the
same invariant check."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
import ray

from bench.harness.faults import (
    EVERY,
    killed_by_fault,
    submit_counter,
    wait_state,
    wait_until_step,
)
from bench.harness.invariants import check, finished
from bench.harness.service import Service
from gangway import JobState, Resources
from gangway.models import ElasticDP

# Gangs start slowly on shared cores (each rank imports torch): more than the default.
pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


def restart_and_finish(service: Service, tmp_path: Path, job_ids: list[int]) -> None:
    service.env.pop("GANGWAY_FAULTS", None)
    client = service.start()
    jobs = finished(client, job_ids)
    assert all(j.state is JobState.SUCCEEDED for j in jobs), [
        (j.id, j.state, j.status_reason) for j in jobs
    ]
    check(client, job_ids, checkpoints=tmp_path / "checkpoints", every=EVERY)


@pytest.mark.faults
def test_kill9_while_admitted(service: Service, tmp_path: Path) -> None:
    """Killed right after the placement group was requested, before the store says
    STARTING: the restarted service requeues the job and reaps that group by name."""
    service.env["GANGWAY_FAULTS"] = "scheduler.launched:kill@1"
    client = service.start()
    job = submit_counter(client, steps=15)
    killed_by_fault(service)
    restart_and_finish(service, tmp_path, [job.id])


@pytest.mark.faults
def test_kill9_while_starting(service: Service, tmp_path: Path) -> None:
    """Killed while the rank actors start: they are detached and keep starting, so the
    restarted service must reap them by name before it starts attempt 2."""
    client = service.start()
    job = submit_counter(client, steps=15)
    wait_state(client, job.id, "STARTING")
    service.stop(signal.SIGKILL)
    restart_and_finish(service, tmp_path, [job.id])


@pytest.mark.faults
def test_kill9_while_running(service: Service, tmp_path: Path) -> None:
    client = service.start()
    job = submit_counter(client, steps=40)
    wait_state(client, job.id, "stepping")
    service.stop(signal.SIGKILL)
    restart_and_finish(service, tmp_path, [job.id])


@pytest.mark.faults
def test_kill9_while_preempting(service: Service, tmp_path: Path) -> None:
    """Killed right after sending the stop notice (which may die with it): the restarted
    service reattaches the victim, sends the notice again, requeues it once it has saved,
    and both jobs finish. Two GPUs per rank: the whole cluster in four actors."""
    service.env["GANGWAY_FAULTS"] = "scheduler.preempted:kill@1"
    client = service.start()
    two = Resources(gpus_per_rank=2)
    low = submit_counter(client, name="victim", dp=4, steps=300, step_s=0.05, resources=two)
    wait_state(client, low.id, "stepping")
    high = submit_counter(client, name="urgent", dp=1, steps=10, priority=10, resources=two)
    killed_by_fault(service)
    restart_and_finish(service, tmp_path, [low.id, high.id])


@pytest.mark.faults_slow
def test_kill9_while_resizing(service: Service, tmp_path: Path) -> None:
    """An elastic job grows onto GPUs a finished job freed; the service is killed right
    after the resize notice. The restart reaps the old gang by name and relaunches. Two
    GPUs per rank: the whole cluster in four actors."""
    service.env["GANGWAY_FAULTS"] = "scheduler.resizing:kill@1"
    client = service.start()
    two = Resources(gpus_per_rank=2)
    # 40 steps of 0.1 s: it must still be running when the test sees it step.
    blocker = submit_counter(client, name="blocker", dp=2, steps=40, resources=two)
    wait_state(client, blocker.id, "stepping")
    elastic = submit_counter(
        client, name="elastic", dp=ElasticDP(min=1, max=4), steps=80, resources=two
    )
    killed_by_fault(service, timeout_s=180)
    restart_and_finish(service, tmp_path, [blocker.id, elastic.id])


@pytest.mark.faults
def test_rank_sigkill_restarts_from_the_checkpoint(service: Service, tmp_path: Path) -> None:
    client = service.start()
    job = submit_counter(client, steps=30, max_restarts=1)
    wait_state(client, job.id, "stepping")
    wait_until_step(client, job.id, EVERY + 2)
    actor = ray.get_actor(f"gangway-job{job.id}-attempt1-rank1", namespace="gangway")
    os.kill(ray.get(actor.status.remote())["pid"], signal.SIGKILL)
    jobs = finished(client, [job.id])
    assert jobs[0].state is JobState.SUCCEEDED and jobs[0].attempt == 2, jobs[0].status_reason
    check(client, [job.id], checkpoints=tmp_path / "checkpoints", every=EVERY)


@pytest.mark.faults
def test_a_stuck_rank_supervisor_fails_the_attempt_and_the_job_resumes(
    service: Service, tmp_path: Path
) -> None:
    """Rank 1's supervisor is stopped (SIGSTOP): its status call neither returns nor
    fails, and Ray does not call the actor dead. The attempt fails once the round has
    gone unanswered for the trouble grace, naming the rank; the next resumes."""
    service.env["GANGWAY_RAY_TROUBLE_GRACE_S"] = "8"
    client = service.start()
    job = submit_counter(client, steps=150, max_restarts=1)  # its program steps on meanwhile
    wait_state(client, job.id, "stepping")
    wait_until_step(client, job.id, EVERY + 2)
    actor = ray.get_actor(f"gangway-job{job.id}-attempt1-rank1", namespace="gangway")
    supervisor = ray.get(actor.status.remote())["pid"]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        jobs = finished(client, [job.id])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGCONT)  # a stopped process would outlive the case
    assert jobs[0].state is JobState.SUCCEEDED and jobs[0].attempt == 2, jobs[0].status_reason
    reasons = [event.reason for event in client.events(job.id)]
    assert any("rank(s) 1 " in r and "did not answer a status call" in r for r in reasons), reasons
    ledger = (tmp_path / "checkpoints" / f"job-{job.id}" / "ledger").read_text().splitlines()
    assert any(line.startswith("resume ") and line != "resume 0" for line in ledger), ledger
    check(client, [job.id], checkpoints=tmp_path / "checkpoints", every=EVERY)


@pytest.mark.faults
def test_rank_killed_mid_checkpoint_save(service: Service, tmp_path: Path) -> None:
    """Rank 0 dies while writing its second save (the count is written, not renamed):
    the next attempt resumes from the first save, which the crash left intact."""
    service.env["GANGWAY_FAULTS"] = "checkpoint.save:kill@2"
    client = service.start()
    job = submit_counter(client, steps=12, max_restarts=1)
    jobs = finished(client, [job.id])
    assert jobs[0].state is JobState.SUCCEEDED and jobs[0].attempt == 2, jobs[0].status_reason
    ledger = (tmp_path / "checkpoints" / f"job-{job.id}" / "ledger").read_text().splitlines()
    assert ledger.count("resume 5") == 1 and "step 10" in ledger
    check(client, [job.id], checkpoints=tmp_path / "checkpoints", every=EVERY)
