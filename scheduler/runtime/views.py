"""Store records -> the core's domain views."""

from __future__ import annotations

from scheduler.model import GangShape, JobView, Parallelism, Placement
from scheduler.store import JobRecord


def gang_shape(spec: dict[str, object]) -> GangShape:
    parallelism = spec["parallelism"]
    resources = spec["resources"]
    assert isinstance(parallelism, dict) and isinstance(resources, dict)
    return GangShape(
        parallelism=Parallelism(
            dp=int(parallelism["dp"]), tp=int(parallelism["tp"]), pp=int(parallelism["pp"])
        ),
        gpus_per_rank=int(resources["gpus_per_rank"]),
        cpus_per_rank=float(resources["cpus_per_rank"]),
    )


def job_view(record: JobRecord) -> JobView:
    return JobView(
        id=record.id,
        priority=record.priority,
        submitted_at=record.submitted_at,
        state=record.state,
        shape=gang_shape(record.spec),
        placement=Placement(record.placement) if record.placement else None,
    )
