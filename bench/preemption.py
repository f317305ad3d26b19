"""Preemption notice to acknowledgement, and steps lost, on a real worker group.

    .venv/bin/python -m bench.preemption --repeat 3

Starts one local Ray (2 nodes x 4 logical GPUs, as `gangway serve` embeds) and, for each
model, launches the built-in trainer as a dp=2 `WorkerGroup` with a checkpoint directory,
lets it train a few steps, sends the stop notice (`WorkerGroup.stop`, what the loop sends
on Preempt and Resize) and polls every 50 ms until the gang has exited. Per run it prints:
ack (the ranks' own figure: notice to the last rank returning, after the agreed step and
the checkpoint), seen (driver: notice to the exited gang observed), the step it stopped
at, the step saved, and steps lost (stopped - saved; 0 is the goal).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from scheduler.runtime.cluster import RayClusterSource
from scheduler.runtime.gangs.group import GroupSpec, WorkerGroup
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.local_ray import LocalClusterShape, ray_directory, start_local_cluster
from workers.launch import BuiltinRun, JobLaunch


def _spec(job_id: int, model: str, node_id: str, checkpoints: Path) -> GroupSpec:
    run = BuiltinRun(fields={"model": model, "steps": 100_000, "batch_size": 4})
    return GroupSpec(
        node_ids=(node_id, node_id),
        gpus_per_rank=1,
        cpus_per_rank=1.0,
        dp=2,
        tp=1,
        pp=1,
        launch=JobLaunch(
            job_id=job_id,
            attempt=1,
            user="bench",
            run=run,
            checkpoint_dir=str(checkpoints / f"job-{job_id}"),
        ),
    )


def _poll_until(group: WorkerGroup, done: Any, timeout_s: float = 300) -> GroupStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = group.poll()
        if status.phase is GroupPhase.FAILED:
            raise RuntimeError(status.error)
        if done(status):
            return status
        time.sleep(0.05)
    raise TimeoutError("the group did not get there in time")


def one_preemption(spec: GroupSpec) -> dict[str, float]:
    group = WorkerGroup.launch(spec, placement_timeout_s=120)
    try:
        _poll_until(group, lambda s: s.step >= 5)
        sent = time.monotonic()
        group.stop()
        status = _poll_until(group, lambda s: s.phase is GroupPhase.SUCCEEDED)
        seen = time.monotonic() - sent
    finally:
        group.teardown()
    saved = status.checkpoint_step if status.checkpoint_step is not None else 0
    return {
        "ack_s": status.stop_ack_s if status.stop_ack_s is not None else float("nan"),
        "seen_s": seen,
        "stopped": status.step,
        "saved": saved,
        "lost": status.step - saved,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["gpt-tiny", "gpt-mini"])
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory()
    directory = ray_directory(Path(scratch.name))
    cluster: Any = start_local_cluster(LocalClusterShape(num_nodes=2, gpus_per_node=4), directory)
    node_id = sorted(RayClusterSource().nodes(), key=lambda n: n.name)[0].id
    job_id = 0
    try:
        with tempfile.TemporaryDirectory() as checkpoints:
            for model in args.models:
                acks, lost = [], []
                for _ in range(args.repeat):
                    job_id += 1
                    run = one_preemption(_spec(job_id, model, node_id, Path(checkpoints)))
                    acks.append(run["ack_s"])
                    lost.append(run["lost"])
                    print(
                        f"{model}: ack {run['ack_s']:.2f} s, seen {run['seen_s']:.2f} s, "
                        f"stopped at {run['stopped']:.0f}, saved {run['saved']:.0f}, "
                        f"lost {run['lost']:.0f}"
                    )
                print(
                    f"{model}: median ack {statistics.median(acks):.2f} s, "
                    f"steps lost {sum(lost):.0f} in {args.repeat} preemptions"
                )
    finally:
        ray.shutdown()
        cluster.shutdown()
        scratch.cleanup()


if __name__ == "__main__":
    main()
