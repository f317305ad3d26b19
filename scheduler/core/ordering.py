"""Total orders used by the policy; each documents its criteria and ends on job id."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from datetime import datetime

from scheduler.core.config import PolicyConfig
from scheduler.model import JobState, JobView


def attained_gpu_s(job: JobView, now: datetime) -> float:
    """GPU-seconds the job has consumed: its ended runs plus the current one so far."""
    return job.attained_gpu_s + _current_run_gpu_s(job, now)


def _current_run_gpu_s(job: JobView, now: datetime) -> float:
    run = job.run
    if run is None or job.state is not JobState.RUNNING:
        return 0.0
    return max(0.0, (now - run.started_at).total_seconds()) * job.shape.num_gpus


def _queued_at(job: JobView) -> datetime:
    return job.queued_at or job.submitted_at


def remaining_gpu_s(job: JobView) -> float:
    """Predicted GPU-seconds of service still ahead of the job; infinite when unknown."""
    remaining = job.predicted_remaining_s
    return math.inf if remaining is None else remaining * job.shape.num_gpus


def predicted_run_s(job: JobView, now: datetime) -> float | None:
    """The job's whole predicted run time on its gang: the time it has run (GPU-seconds
    attained over its GPUs) plus its predicted remaining run time; None when nothing
    predicts what is left (no prediction, no time limit)."""
    ahead = job.predicted_remaining_s
    if ahead is None:
        ahead = job.time_limit_s
        if ahead is None:
            return None
    return attained_gpu_s(job, now) / max(1, job.shape.num_gpus) + ahead


def protected_after_s(job: JobView, now: datetime, config: PolicyConfig) -> float:
    """How long the job may stay queued (since it last queued) before it is protected:
    `starvation_s`, or `protect_after_runs` x its predicted run time if longer (a job
    nothing predicts: `starvation_s`). A wait bounded by what the job costs (its
    slowdown), not by one figure for all: a 2-day job does not jump ahead of hours of
    short ones by having waited 4 hours."""
    run_s = predicted_run_s(job, now)
    if run_s is None:
        return config.starvation_s
    return max(config.starvation_s, config.protect_after_runs * run_s)


def protected(job: JobView, now: datetime, config: PolicyConfig) -> bool:
    """A pending job queued past `protected_after_s`; a running one whose run started so."""
    queued_at = _queued_at(job)
    if job.state is JobState.PENDING:
        since = (now - queued_at).total_seconds()
    elif job.run is not None:
        since = (job.run.started_at - queued_at).total_seconds()
    else:
        return False
    if since < config.starvation_s:  # the common case, without predicting the run
        return False
    return since >= protected_after_s(job, now, config)


def protection_ratio(job: JobView, now: datetime, config: PolicyConfig) -> float | None:
    """A protected pending job's wait over its predicted run time (0.0 when nothing
    predicts it); None when the job is not protected."""
    if job.state is not JobState.PENDING or not protected(job, now, config):
        return None
    run_s = predicted_run_s(job, now)
    waited_s = (now - _queued_at(job)).total_seconds()
    return waited_s / run_s if run_s else 0.0


def service_band(job: JobView, now: datetime, config: PolicyConfig) -> float:
    """Least-attained-service band (Tiresias' discretised 2D-LAS): the top band,
    len(service_levels_gpu_s), until the job has consumed the first level of GPU-seconds,
    one band lower at each further level. Short jobs finish in the top band; long ones
    sink and yield to newcomers of the same priority. 0 for all jobs when levels are off.

    Starvation guard: a `protected` job (queued past `protected_after_s`) is promoted to
    the top band (so it may preempt sunk jobs), and the run it then gets counts its
    service from zero, so it is not preempted again as soon as it starts."""
    if config.service_order == "srsf":
        return -remaining_gpu_s(job)
    levels = config.service_levels_gpu_s
    if not levels:
        return 0
    top = len(levels)
    if job.state is JobState.PENDING:
        if protected(job, now, config):
            return top
        used = job.attained_gpu_s
    else:
        promoted = job.run is not None and protected(job, now, config)
        used = _current_run_gpu_s(job, now) if promoted else attained_gpu_s(job, now)
    return top - bisect.bisect_right(levels, used)  # levels reached: used >= level


def rank(job: JobView, now: datetime, config: PolicyConfig) -> tuple[int, float]:
    """What preemption compares: (base priority, service band). Aging is not in it, so
    waiting alone never preempts anyone."""
    return (job.priority, service_band(job, now, config))


def queue_order(
    jobs: Sequence[JobView],
    now: datetime,
    config: PolicyConfig,
    usage: Mapping[tuple[str, str], float] | None = None,
    weights: Mapping[str, float] | None = None,
    *,
    protected_out: dict[int, float] | None = None,
    node_gpus: int = 0,
) -> list[JobView]:
    """Pending jobs: higher aged priority first (priority plus one point per
    `aging_interval_s`, or per `age_per_runs` x the job's predicted run time if longer,
    waited since the job last queued: a job gains priority at the pace of its own slowdown;
    snapped down to the highest priority class among `jobs` that it has reached, so waiting
    lifts a job into a higher class but never over jobs of its own), then protected jobs
    (queued past `protected_after_s`), the longest queued first, so the reservation goes to
    the job that has waited longest past its bound, then higher service band (less GPU time
    attained; see `service_band`), then the order inside a band (`_within_band_key`: Gittins
    index or predicted remaining service, where configured), then the gang that needs
    more GPUs (`larger_gangs_first`: `gang_size`, counted up to one node of `node_gpus`),
    then fair share in two levels among gangs of one size, as Slurm's Fair Tree does with
    accounts and users: the queue's rank by recent usage over its `weights` entry (default
    1), then the user's rank within the queue (0 for the least recent usage: one heavy
    user cannot hold a queue's jobs of one size back, one busy queue cannot take the idle
    GPUs from them), then earlier submit, then id. Guarantees are not in the order:
    quotas and preemption keep them. `protected_out`, when given, receives job id ->
    `protection_ratio` for the protected jobs.
    The key is inlined: it runs for every pending job on every pass."""
    ranks = fair_share_ranks(usage or {})
    queue_ranks = queue_share_ranks(usage or {}, weights or {})
    interval = config.aging_interval_s
    age_per_runs = config.age_per_runs
    classes = sorted({job.priority for job in jobs})  # aging climbs only to these
    top_class = classes[-1] if classes else 0
    starvation_s = config.starvation_s
    protect_after_runs = config.protect_after_runs
    soonest = min(interval, starvation_s)  # no aging and no protection before
    within_band = _within_band_key(config)
    levels = config.service_levels_gpu_s
    top = len(levels)
    las = config.service_order != "srsf"
    larger_first = config.larger_gangs_first

    def key(job: JobView) -> tuple[int, float, float, float, int, int, int, datetime, int]:
        waited_s = (now - (job.queued_at or job.submitted_at)).total_seconds()
        aged = job.priority
        first = 0.0  # protected jobs: minus their wait, the longest first
        if waited_s >= soonest:
            # `predicted_run_s`, inlined; nothing predicts it: 0 (the absolute rules)
            run_s = job.predicted_remaining_s
            if run_s is None:
                run_s = job.time_limit_s
            if run_s is None:
                run_s = 0.0
            elif job.attained_gpu_s:
                run_s += job.attained_gpu_s / max(1, job.shape.num_gpus)
            if waited_s >= interval and aged < top_class:
                aged += int(waited_s // max(interval, age_per_runs * run_s))
                aged = classes[bisect.bisect_right(classes, aged) - 1]
            if waited_s >= starvation_s and waited_s >= protect_after_runs * run_s:
                first = -waited_s
                if protected_out is not None:
                    protected_out[job.id] = waited_s / run_s if run_s else 0.0
        user_rank = ranks.get((job.queue, job.user), 0) if ranks else 0
        queue_rank = queue_ranks.get(job.queue, 0) if queue_ranks else 0
        if not las:
            band = -remaining_gpu_s(job)
        elif first or not levels:
            band = top
        else:
            band = top - bisect.bisect_right(levels, job.attained_gpu_s)
        size = -gang_size(job, node_gpus) if larger_first else 0
        inside = within_band(job) if within_band else 0.0
        return (
            -aged,
            first,
            -band,
            inside,
            size,
            queue_rank,
            user_rank,
            job.submitted_at,
            job.id,
        )

    return sorted(jobs, key=key)


def gang_size(job: JobView, node_gpus: int) -> int:
    """The size the gang-size rules compare: the GPUs the gang needs at least
    (`GangShape.min_gpus`: an elastic gang at its dp_min), counted up to one node of
    `node_gpus` (0: no cap). Every gang of a whole node or more is one size: such gangs
    wait alike for whole nodes, and ordering them by size moved waits onto the many
    one-node jobs for little gain to the few larger gangs (ITP cluster04: average JCT
    1.35x 2D-LAS's uncapped; BENCHMARKS.md)."""
    gpus = job.shape.min_gpus
    return min(gpus, node_gpus) if node_gpus > 0 else gpus


def _within_band_key(config: PolicyConfig) -> Callable[[JobView], float] | None:
    """Order inside one service band: the higher Gittins index first (pending jobs'
    attained service is `attained_gpu_s`), or the least predicted remaining service."""
    table = config.gittins
    if config.service_order == "gittins" and table is not None:
        return lambda job: -table.index(job.attained_gpu_s)
    if config.shortest_predicted_first:
        return remaining_gpu_s
    return None


def queue_share_ranks(
    usage: Mapping[tuple[str, str], float], weights: Mapping[str, float]
) -> dict[str, int]:
    """queue -> its position among the queues with recorded usage, by that usage over the
    queue's weight (default 1), least first, ties by name. A queue with no recorded usage
    is not listed: rank 0, with the least used."""
    used: dict[str, float] = {}
    for (queue, _), amount in usage.items():
        used[queue] = used.get(queue, 0.0) + amount
    shares = sorted((amount / weights.get(queue, 1.0), queue) for queue, amount in used.items())
    return {queue: rank for rank, (_, queue) in enumerate(shares)}


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


def work_lost_s(job: JobView, now: datetime) -> float:
    """Seconds of progress a preemption now would throw away: what the runtime measured
    since the last checkpoint, else steps since it x measured step time; the whole run
    while no step time is known."""
    run = job.run
    if run is None:
        return 0.0
    if run.since_checkpoint_s is not None:
        return run.since_checkpoint_s
    if run.step_time_s is None:
        return (now - run.started_at).total_seconds()
    return run.steps_since_checkpoint * run.step_time_s


def victim_order(
    jobs: Sequence[JobView],
    now: datetime,
    config: PolicyConfig,
    borrowed: Set[int] = frozenset(),
    ranks: Mapping[int, tuple[int, float]] | None = None,
    *,
    node_gpus: int = 0,
) -> Iterator[JobView]:
    """Preemption candidates, cheapest first: jobs running on borrowed quota, then lower
    (priority, service band), then the most expendable (a sweep trial its early-stopping
    rule ranks low), then fewer GPUs needed (`smaller_victims_first`: `gang_size`, counted
    up to one node of `node_gpus`), then least work lost (`work_lost_s`), then most
    recently started, then job id.
    `ranks`: job id -> `rank` at `now`, where the caller has them.

    Lazy: candidates are grouped by (borrowed, rank) and each group is sorted only when
    reached, since a preemption usually needs the first few victims of a long list.
    """
    groups: dict[tuple[bool, tuple[int, float]], list[JobView]] = {}
    for job in jobs:
        known = ranks.get(job.id) if ranks is not None else None
        job_rank = known if known is not None else rank(job, now, config)
        groups.setdefault((job.id not in borrowed, job_rank), []).append(job)

    smaller_first = config.smaller_victims_first

    def key(job: JobView) -> tuple[float, int, float, float, int]:
        size = gang_size(job, node_gpus) if smaller_first else 0
        run = job.run
        if run is None:
            return (-job.expendable, size, 0.0, 0.0, job.id)
        age_s = (now - run.started_at).total_seconds()  # smaller: started more recently
        return (-job.expendable, size, work_lost_s(job, now), age_s, job.id)

    for group in sorted(groups):
        yield from sorted(groups[group], key=key)
