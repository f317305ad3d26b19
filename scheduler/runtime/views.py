"""Store records -> the core's domain views."""

from __future__ import annotations

from typing import Any

from scheduler.model import GangShape, JobView, Parallelism, Placement, RunInfo
from scheduler.store import JobRecord


def gang_shape(spec: dict[str, Any]) -> GangShape:
    parallelism = spec["parallelism"]
    resources = spec["resources"]
    return GangShape(
        parallelism=Parallelism(
            dp=int(parallelism["dp"]), tp=int(parallelism["tp"]), pp=int(parallelism["pp"])
        ),
        gpus_per_rank=int(resources["gpus_per_rank"]),
        cpus_per_rank=float(resources["cpus_per_rank"]),
    )


def job_view(record: JobRecord) -> JobView:
    limit = record.spec.get("time_limit_s")
    return JobView(
        id=record.id,
        priority=record.priority,
        submitted_at=record.submitted_at,
        state=record.state,
        shape=gang_shape(record.spec),
        placement=Placement(record.placement) if record.placement else None,
        preemptible=bool(record.spec.get("preemptible", True)),
        time_limit_s=float(limit) if limit is not None else None,
        run=run_info(record),
        queue=record.queue,
        user=record.user,
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
