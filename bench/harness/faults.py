"""What the fault cases and `bench/soak.py` share: a service on an external Ray set up
for faults, the counting job every case runs, and waits."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from bench.harness.service import Service
from gangway import Client, Function, JobInfo, Parallelism

EVERY = 5  # the checkpoint interval of the cases' jobs, in steps


def make_service(data_dir: Path, ray_cluster: Any, database_url: str = "") -> Service:
    svc = Service(
        data_dir=data_dir,
        database_url=database_url or f"sqlite:///{data_dir}/gangway.db",
        ray_address=ray_cluster.address,
    )
    svc.env.update(
        GANGWAY_LEASE_TTL_S="6",
        GANGWAY_MIN_RUNTIME_S="0",
        GANGWAY_CHECKPOINT_GRACE_S="60",
        GANGWAY_SWEEP_EVERY_PASSES="20",
    )
    return svc


def submit_counter(
    client: Client,
    *,
    name: str = "counter",
    dp: Any = 2,
    steps: int = 40,
    step_s: float = 0.1,
    **fields: Any,
) -> JobInfo:
    """A `checkpointed_steps` job: saves every EVERY steps and keeps a ledger."""
    return client.submit(
        name=name,
        parallelism=Parallelism(dp=dp),
        entrypoint=Function(
            target="workers.examples:checkpointed_steps",
            kwargs={"steps": steps, "step_s": step_s, "every": EVERY},
        ),
        **fields,
    )


def killed_by_fault(service: Service, timeout_s: float = 120) -> None:
    """Wait for the service to SIGKILL itself at its injected fault point."""
    assert service.process is not None
    try:
        code = service.process.wait(timeout=timeout_s)
    except Exception as exc:
        raise AssertionError(f"the service never reached its fault point: {exc}") from exc
    assert code == -signal.SIGKILL, f"exited with {code}: {service.log_tail()}"


def wait_state(client: Client, job_id: int, *states: str, timeout_s: float = 120) -> JobInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(job_id)
        if job.state.value in states or (
            "stepping" in states and job.state.value == "RUNNING" and job.progress.step > 0
        ):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} is {job.state.value} ({job.status_reason}), not {states}")


def wait_until_step(client: Client, job_id: int, step: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get(job_id).progress.step < step and time.monotonic() < deadline:
        time.sleep(0.1)
