"""Total orders used by the policy; each documents its criteria and ends on job id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from datetime import datetime

from scheduler.core.config import PolicyConfig
from scheduler.model import JobView


def effective_priority(job: JobView, now: datetime, config: PolicyConfig) -> int:
    """Priority plus one point per `aging_interval_s` waited since submit (never negative)."""
    waited_s = max(0.0, (now - job.submitted_at).total_seconds())
    return job.priority + int(waited_s // config.aging_interval_s)


def queue_order(
    jobs: Sequence[JobView],
    now: datetime,
    config: PolicyConfig,
    usage: Mapping[tuple[str, str], float] | None = None,
) -> list[JobView]:
    """Pending jobs: higher effective priority (priority + aging) first, then the user
    with less recent usage in that queue (fair share: one heavy user cannot hold a queue),
    then earlier submit, then lower id."""
    recent = usage or {}
    return sorted(
        jobs,
        key=lambda j: (
            -effective_priority(j, now, config),
            recent.get((j.queue, j.user), 0.0),
            j.submitted_at,
            j.id,
        ),
    )


def victim_order(
    jobs: Sequence[JobView], now: datetime, borrowed: Set[int] = frozenset()
) -> list[JobView]:
    """Preemption candidates, cheapest first: jobs running on borrowed quota, then lower
    priority, then least work lost since the last checkpoint (seconds), then most
    recently started, then job id."""

    def key(job: JobView) -> tuple[bool, int, float, float, int]:
        started = job.run.started_at if job.run else now
        lost = lost_work_s(job, now)
        return (job.id not in borrowed, job.priority, lost, -started.timestamp(), job.id)

    return sorted(jobs, key=key)


def lost_work_s(job: JobView, now: datetime) -> float:
    """Seconds of work a preemption would throw away: steps since the last checkpoint x
    step time, or the whole run when no step time is known yet."""
    if job.run is None:
        return 0.0
    if job.run.step_time_s is not None:
        return job.run.steps_since_checkpoint * job.run.step_time_s
    return max(0.0, (now - job.run.started_at).total_seconds())
