"""Small fluent builders for scheduling tests: clusters, pending and running jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from scheduler.model import (
    ClusterSnapshot,
    GangShape,
    JobState,
    JobView,
    Node,
    Parallelism,
    Placement,
    RunInfo,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """A time relative to NOW."""
    return NOW + timedelta(seconds=seconds)


class Cluster:
    def __init__(self) -> None:
        self._nodes: list[Node] = []

    def nodes(
        self, count: int, gpus: int, *, alive: bool = True, rack: str | None = None
    ) -> Cluster:
        for _ in range(count):
            index = len(self._nodes)
            self._nodes.append(Node(f"n{index}", f"node-{index}", gpus, 16.0 * gpus, alive, rack))
        return self

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(tuple(self._nodes))


def pending(
    job_id: int,
    *,
    dp: int = 1,
    tp: int = 1,
    priority: int = 0,
    submitted: float = -60,
    time_limit_s: float | None = None,
    queue: str = "default",
    user: str = "default",
    dp_min: int | None = None,
) -> JobView:
    return JobView(
        id=job_id,
        priority=priority,
        submitted_at=at(submitted),
        state=JobState.PENDING,
        shape=GangShape(
            Parallelism(dp=dp, tp=tp), dp_min=dp_min, dp_max=dp if dp_min is not None else None
        ),
        time_limit_s=time_limit_s,
        queue=queue,
        user=user,
    )


def running(
    job_id: int,
    on: list[str],
    *,
    tp: int = 1,
    priority: int = 0,
    started: float = -3600,
    time_limit_s: float | None = None,
    step: int = 0,
    total_steps: int | None = None,
    step_time_s: float | None = None,
    preemptible: bool = True,
    state: JobState = JobState.RUNNING,
    queue: str = "default",
    dp_range: tuple[int, int] | None = None,
) -> JobView:
    return JobView(
        id=job_id,
        priority=priority,
        submitted_at=at(started - 10),
        state=state,
        shape=GangShape(
            Parallelism(dp=len(on) // tp, tp=tp),
            dp_min=dp_range[0] if dp_range else None,
            dp_max=dp_range[1] if dp_range else None,
        ),
        placement=Placement(tuple(on)),
        preemptible=preemptible,
        time_limit_s=time_limit_s,
        run=RunInfo(
            started_at=at(started),
            step=step,
            total_steps=total_steps,
            step_time_s=step_time_s,
            steps_since_checkpoint=step,
        ),
        queue=queue,
    )
