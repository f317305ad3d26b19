"""What a simulated schedule did to the queue: completion times, waits, utilization,
preemption cost, starvation, fairness."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scheduler.predict.runtime import accuracy
from scheduler.sim.jobs import SimJob, SimResult

SIZE_CLASSES = (("1 GPU", 1, 1), ("2-8 GPUs", 2, 8), (">8 GPUs", 9, 10**9))


@dataclass(frozen=True)
class Metrics:
    policy: str
    jobs: int
    jct_avg_s: float
    jct_median_s: float
    jct_p95_s: float
    jct_p99_s: float
    wait_avg_s: float
    wait_p99_s: float
    wait_by_size: dict[str, tuple[float, float]]  # class -> (average, p99) queueing delay
    longest_wait_s: float
    makespan_s: float
    utilization: float
    preemptions: int
    lost_gpu_hours: float
    jain_fairness: float  # across queues, of mean (run time / completion time)
    # The runtime predictor on this run's jobs, each predicted at arrival from the jobs
    # finished before it: how many got a prediction, median absolute % error, Spearman.
    predicted_jobs: int = 0
    prediction_mdape: float | None = None
    prediction_spearman: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def jain_index(values: Sequence[float]) -> float:
    """(sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one gets everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def compute(result: SimResult) -> Metrics:
    jobs = [j for j in result.jobs if j.finish_s is not None and j.first_start_s is not None]
    if not jobs:
        raise ValueError("no job finished: nothing to measure")
    jct = [_jct(j) for j in jobs]
    waits = [_wait(j) for j in jobs]
    by_size = {}
    for name, low, high in SIZE_CLASSES:
        members = [_wait(j) for j in jobs if low <= j.trace.num_gpus <= high]
        if members:
            by_size[name] = (statistics.fmean(members), percentile(members, 99))
    predictions = accuracy([(j.predicted_s, j.trace.duration_s) for j in jobs])
    busy_gpu_s = sum(j.attained_gpu_s for j in jobs)
    capacity_gpu_s = result.total_gpus * result.makespan_s
    return Metrics(
        policy=result.policy,
        jobs=len(jobs),
        jct_avg_s=statistics.fmean(jct),
        jct_median_s=statistics.median(jct),
        jct_p95_s=percentile(jct, 95),
        jct_p99_s=percentile(jct, 99),
        wait_avg_s=statistics.fmean(waits),
        wait_p99_s=percentile(waits, 99),
        wait_by_size=by_size,
        longest_wait_s=max(waits),
        makespan_s=result.makespan_s,
        utilization=busy_gpu_s / capacity_gpu_s if capacity_gpu_s else 0.0,
        preemptions=sum(j.preemptions for j in jobs),
        lost_gpu_hours=sum(j.lost_gpu_s for j in jobs) / 3600,
        jain_fairness=jain_index(_speed_by_queue(jobs)),
        predicted_jobs=predictions.predicted,
        prediction_mdape=predictions.median_ape,
        prediction_spearman=predictions.spearman,
    )


def _jct(job: SimJob) -> float:
    assert job.finish_s is not None
    return job.finish_s - job.trace.submit_s


def _wait(job: SimJob) -> float:
    """Queueing delay: all the time the job sat in the queue, before its first start and
    again after each preemption (a preempted job that never gets back is starving too)."""
    return job.waited_s


def _speed_by_queue(jobs: Sequence[SimJob]) -> list[float]:
    """Per queue, the mean of run time / completion time (1: never waited)."""
    speeds: dict[str, list[float]] = {}
    for job in jobs:
        speeds.setdefault(job.trace.queue, []).append(job.trace.duration_s / _jct(job))
    return [statistics.fmean(v) for v in speeds.values()]
