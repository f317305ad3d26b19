"""Store records -> the core's domain views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.model import GangShape, JobView, Parallelism, Placement, RunInfo
from scheduler.store import JobRecord


def gang_shape(spec: dict[str, Any], placement: Sequence[str] | None = None) -> GangShape:
    """The job's gang. An elastic dp ({min, max}) is described at max, or at the degree
    its placement shows once it holds one."""
    parallelism = spec["parallelism"]
    resources = spec["resources"]
    tp, pp = int(parallelism["tp"]), int(parallelism["pp"])
    dp_spec = parallelism["dp"]
    dp_min = dp_max = None
    if isinstance(dp_spec, dict):
        dp_min, dp_max = int(dp_spec["min"]), int(dp_spec["max"])
        dp = dp_max
    else:
        dp = int(dp_spec)
    if placement:
        dp = len(placement) // (tp * pp)
    return GangShape(
        parallelism=Parallelism(dp=dp, tp=tp, pp=pp),
        gpus_per_rank=int(resources["gpus_per_rank"]),
        cpus_per_rank=float(resources["cpus_per_rank"]),
        dp_min=dp_min,
        dp_max=dp_max,
    )


def job_view(record: JobRecord) -> JobView:
    limit = record.spec.get("time_limit_s")
    return JobView(
        id=record.id,
        priority=record.priority,
        submitted_at=record.submitted_at,
        state=record.state,
        shape=gang_shape(record.spec, record.placement),
        placement=Placement(record.placement) if record.placement else None,
        preemptible=bool(record.spec.get("preemptible", True)),
        time_limit_s=float(limit) if limit is not None else None,
        run=run_info(record),
        queue=record.queue,
        user=record.user,
        attained_gpu_s=record.attained_gpu_s,
        queued_at=record.queued_at,
    )


def run_info(record: JobRecord) -> RunInfo | None:
    """Measured progress of a job holding resources. Step time is the mean over this
    attempt so far; with no checkpoints yet, every step done would be lost."""
    started = record.started_at or record.admitted_at
    if record.placement is None or started is None:
        return None
    step_time_s = None
    if record.step > 0 and record.progress_at is not None:
        step_time_s = max(0.0, (record.progress_at - started).total_seconds()) / record.step
    return RunInfo(
        started_at=started,
        step=record.step,
        total_steps=record.total_steps,
        step_time_s=step_time_s,
        steps_since_checkpoint=record.step,
    )
