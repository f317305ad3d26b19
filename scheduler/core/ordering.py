"""Total orders used by the policy; each documents its criteria and ends on job id."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from datetime import datetime

from scheduler.core.config import PolicyConfig
from scheduler.model import JobView


def queue_order(
    jobs: Sequence[JobView],
    now: datetime,
    config: PolicyConfig,
    usage: Mapping[tuple[str, str], float] | None = None,
) -> list[JobView]:
    """Pending jobs: higher effective priority first (priority plus one point per
    `aging_interval_s` waited since submit), then the user's fair-share rank within the
    job's queue (0 for the user with the least recent usage there: one heavy user cannot
    hold a queue, and queues are never ranked against each other by usage), then earlier
    submit, then id. The key is inlined: it runs for every pending job on every pass."""
    ranks = fair_share_ranks(usage or {})
    interval = config.aging_interval_s

    def key(job: JobView) -> tuple[int, int, datetime, int]:
        waited_s = (now - job.submitted_at).total_seconds()
        aged = job.priority + (int(waited_s // interval) if waited_s > 0 else 0)
        rank = ranks.get((job.queue, job.user), 0) if ranks else 0
        return (-aged, rank, job.submitted_at, job.id)

    return sorted(jobs, key=key)


def fair_share_ranks(usage: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], int]:
    """(queue, user) -> position of the user among that queue's users by recent usage,
    least first (ties by user name). Users with no recorded usage are not listed: rank 0."""
    by_queue: dict[str, list[tuple[float, str]]] = {}
    for (queue, user), used in usage.items():
        by_queue.setdefault(queue, []).append((used, user))
    ranks: dict[tuple[str, str], int] = {}
    for queue, users in by_queue.items():
        for rank, (_, user) in enumerate(sorted(users)):
            ranks[(queue, user)] = rank
    return ranks


def victim_order(
    jobs: Sequence[JobView], now: datetime, borrowed: Set[int] = frozenset()
) -> Iterator[JobView]:
    """Preemption candidates, cheapest first: jobs running on borrowed quota, then lower
    priority, then least work lost since the last checkpoint (steps since it x measured
    step time; the whole run while no step time is known), then most recently started,
    then job id.

    Lazy: candidates are grouped by (borrowed, priority) and each group is sorted only when
    reached, since a preemption usually needs the first few victims of a long list.
    """
    groups: dict[tuple[bool, int], list[JobView]] = {}
    for job in jobs:
        groups.setdefault((job.id not in borrowed, job.priority), []).append(job)

    def key(job: JobView) -> tuple[float, float, int]:
        run = job.run
        if run is None:
            return (0.0, 0.0, job.id)
        age_s = (now - run.started_at).total_seconds()  # smaller: started more recently
        lost = (
            run.steps_since_checkpoint * run.step_time_s if run.step_time_s is not None else age_s
        )
        return (lost, age_s, job.id)

    for group in sorted(groups):
        yield from sorted(groups[group], key=key)
