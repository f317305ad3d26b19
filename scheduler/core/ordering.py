"""Total orders used by the policy; each documents its criteria and ends on job id."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from scheduler.core.config import PolicyConfig
from scheduler.model import JobView


def effective_priority(job: JobView, now: datetime, config: PolicyConfig) -> int:
    """Priority plus one point per `aging_interval_s` waited since submit (never negative)."""
    waited_s = max(0.0, (now - job.submitted_at).total_seconds())
    return job.priority + int(waited_s // config.aging_interval_s)


def queue_order(jobs: Sequence[JobView], now: datetime, config: PolicyConfig) -> list[JobView]:
    """Pending jobs: higher effective priority (priority + aging) first, then earlier
    submit, then lower id."""
    return sorted(jobs, key=lambda j: (-effective_priority(j, now, config), j.submitted_at, j.id))


def victim_order(jobs: Sequence[JobView], now: datetime) -> list[JobView]:
    """Preemption candidates, cheapest first: lower priority, then least work lost since
    the last checkpoint (seconds), then most recently started, then job id."""

    def key(job: JobView) -> tuple[int, float, float, int]:
        started = job.run.started_at if job.run else now
        return (job.priority, lost_work_s(job, now), -started.timestamp(), job.id)

    return sorted(jobs, key=key)


def lost_work_s(job: JobView, now: datetime) -> float:
    """Seconds of work a preemption would throw away: steps since the last checkpoint x
    step time, or the whole run when no step time is known yet."""
    if job.run is None:
        return 0.0
    if job.run.step_time_s is not None:
        return job.run.steps_since_checkpoint * job.run.step_time_s
    return max(0.0, (now - job.run.started_at).total_seconds())
