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
    priority, then least work lost since the last checkpoint (steps since it x measured
    step time; the whole run while no step time is known), then most recently started,
    then job id."""

    def key(job: JobView) -> tuple[bool, int, float, float, int]:
        run = job.run
        if run is None:
            return (job.id not in borrowed, job.priority, 0.0, 0.0, job.id)
        age_s = (now - run.started_at).total_seconds()  # smaller: started more recently
        lost = (
            run.steps_since_checkpoint * run.step_time_s if run.step_time_s is not None else age_s
        )
        return (job.id not in borrowed, job.priority, lost, age_s, job.id)

    return sorted(jobs, key=key)
