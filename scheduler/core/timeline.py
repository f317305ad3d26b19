"""When will resources free up? Expected ends of running jobs and earliest start times.

Estimates use only what a real cluster knows: the job's time limit, or steps left x the
measured step time, or its predicted remaining run time (`JobView.predicted_remaining_s`,
from the cluster's history), or `default_runtime_s` when none is known. A job past its
estimate is assumed to end now (it may end any moment).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from scheduler.core.config import PolicyConfig
from scheduler.core.placement import Capacity, FreePool, place_gang, usage
from scheduler.model import GangShape, JobState, JobView, Placement


class Release(NamedTuple):
    """Resources expected back at `at`. Tuples order by (at, job_id), job ids being
    unique, so a sorted list of releases needs no key function (the pass inserts many)."""

    at: datetime
    job_id: int
    capacity: Mapping[str, Capacity]
    gpus: int  # total of `capacity`


@dataclass(frozen=True, slots=True)
class Start:
    at: datetime
    placement: Placement
    free: dict[str, Capacity]  # capacity at `at`, before this job takes its placement


def expected_end(job: JobView, now: datetime, config: PolicyConfig) -> datetime:
    if job.state is JobState.PREEMPTING:
        return now + timedelta(seconds=config.checkpoint_grace_s)
    run = job.run
    if _predicted_only(job) and job.predicted_remaining_s is not None:
        return now + timedelta(seconds=job.predicted_remaining_s)
    started = run.started_at if run else now
    return max(now, started + timedelta(seconds=expected_runtime_s(job, config)))


def expected_runtime_s(job: JobView, config: PolicyConfig) -> float:
    """Run time from the start of the job's current (or next) run."""
    if job.time_limit_s is not None:
        return job.time_limit_s
    run = job.run
    if run and run.step_time_s is not None and run.total_steps is not None:
        return run.total_steps * run.step_time_s
    if job.predicted_remaining_s is not None:
        return job.predicted_remaining_s
    return config.default_runtime_s


def runtime_known(job: JobView) -> bool:
    """Something tells the job's run time (a limit, measured steps, a prediction), not
    only the policy's default guess: an estimate built on it is worth showing."""
    run = job.run
    measured = run is not None and run.step_time_s is not None and run.total_steps is not None
    return job.time_limit_s is not None or measured or job.predicted_remaining_s is not None


def _predicted_only(job: JobView) -> bool:
    """No time limit and no measured steps left: only a prediction can tell the end."""
    run = job.run
    measured = run is not None and run.step_time_s is not None and run.total_steps is not None
    return job.time_limit_s is None and not measured


def release_timeline(
    holders: Sequence[JobView], now: datetime, config: PolicyConfig
) -> list[Release]:
    """Every holder's resources, in the order they are expected back (ties by job id)."""
    releases = [
        Release(
            expected_end(job, now, config),
            job.id,
            usage(job.shape, job.placement),
            job.shape.num_gpus,
        )
        for job in holders
        if job.placement is not None
    ]
    return sorted(releases)


def earliest_start(
    shape: GangShape,
    free: FreePool,
    releases: Sequence[Release],
    now: datetime,
    *,
    scratch: bool = False,
) -> Start | None:
    """The first time the gang fits, adding releases in order; None if it never does.

    One pool is updated release by release (O(nodes touched) each), and placement is only
    tried once the free total covers the gang, so a search costs about O(R) small steps.
    `scratch`: `free` is the caller's own copy, which the search may change instead of
    copying it again (a pool of a thousand nodes is the search's largest cost).
    """
    placement = place_gang(shape, free)
    if placement is not None:
        return Start(now, placement, free.as_dict())
    pool = free if scratch else free.copy()
    for release in releases:
        for node_id, cap in release.capacity.items():
            pool.give(node_id, cap)
        if pool.total_gpus < shape.num_gpus:
            continue
        placement = place_gang(shape, pool)
        if placement is not None:
            return Start(release.at, placement, pool.as_dict())
    return None
