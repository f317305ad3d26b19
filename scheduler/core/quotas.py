"""Queue quotas: how many GPUs each queue holds, and which running jobs are borrowing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from scheduler.model import JobView, QueueQuota

NO_QUOTA = QueueQuota()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def gpus_by_queue(holders: Iterable[JobView]) -> dict[str, int]:
    used: dict[str, int] = {}
    for job in holders:
        used[job.queue] = used.get(job.queue, 0) + job.shape.num_gpus
    return used


def borrowing_jobs(holders: Sequence[JobView], queues: Mapping[str, QueueQuota]) -> set[int]:
    """Holders beyond their queue's guarantee. Within a queue the earliest started jobs
    count against the guarantee first (ties by id), so the most recent are the borrowers."""
    borrowed: set[int] = set()
    used: dict[str, int] = {}
    for job in sorted(holders, key=lambda j: (j.run.started_at if j.run else _EPOCH, j.id)):
        used[job.queue] = used.get(job.queue, 0) + job.shape.num_gpus
        if used[job.queue] > queues.get(job.queue, NO_QUOTA).guaranteed_gpus:
            borrowed.add(job.id)
    return borrowed


def over_limit(
    job: JobView, used: Mapping[str, int], queues: Mapping[str, QueueQuota]
) -> str | None:
    """Why starting `job` would exceed its queue's limit, or None."""
    quota = queues.get(job.queue, NO_QUOTA)
    limit = quota.max_gpus
    held = used.get(job.queue, 0)
    if limit is None or held + job.shape.num_gpus <= limit:
        return None
    return (
        f"queue {job.queue!r} holds {held} GPUs; {job.shape.num_gpus} more would exceed its "
        f"limit of {limit} ({quota.guaranteed_gpus} guaranteed + {quota.borrow_limit_gpus} "
        "borrowable)"
    )


def within_guarantee(
    job: JobView, used: Mapping[str, int], queues: Mapping[str, QueueQuota]
) -> bool:
    """Would the queue still be inside its guarantee with this job? Then it may reclaim."""
    guaranteed = queues.get(job.queue, NO_QUOTA).guaranteed_gpus
    return used.get(job.queue, 0) + job.shape.num_gpus <= guaranteed
