"""Trace loaders: public GPU-cluster job histories -> `TraceJob`s, first arrival at t = 0.

Formats are recognised by their header (see `../shared/traces/README.md`):
- Philly subsets, normalised:   job_id,submit_time,num_gpu,duration,vc
- Philly digest:                timestamp,duration,num_gpus,gpu_time,cluster  (unsorted)
- Microsoft ITP (ElasticFlow):  job_id,submission_time,duration,num_gpu
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: int
    submit_s: float
    num_gpus: int
    duration_s: float
    queue: str = "default"


class TraceFormatError(ValueError):
    pass


def load_trace(path: Path, *, limit: int | None = None) -> list[TraceJob]:
    """Jobs sorted by submit time (ties by order in the file), shifted to start at 0.
    Jobs with no GPUs or no duration are dropped: they never occupy the cluster."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        parse = _parser(set(reader.fieldnames or ()), path)
        rows = [job for index, row in enumerate(reader) if (job := parse(index, row)) is not None]
    rows.sort(key=lambda j: (j.submit_s, j.job_id))
    if limit is not None:
        rows = rows[:limit]
    return _shift_to_zero(rows)


def _parser(columns: set[str], path: Path) -> Callable[[int, dict[str, str]], TraceJob | None]:
    if {"submit_time", "num_gpu", "duration"} <= columns:
        return _philly_subset
    if {"timestamp", "num_gpus", "duration"} <= columns:
        return _philly_digest
    if {"submission_time", "num_gpu", "duration"} <= columns:
        return _itp
    raise TraceFormatError(f"{path}: unknown trace columns {sorted(columns)}")


def _job(index: int, submit_s: float, gpus: str, duration: str, queue: str) -> TraceJob | None:
    num_gpus, duration_s = int(float(gpus)), float(duration)
    if num_gpus < 1 or duration_s <= 0:
        return None
    return TraceJob(index, submit_s, num_gpus, duration_s, queue or "default")


def _philly_subset(index: int, row: dict[str, str]) -> TraceJob | None:
    return _job(
        index, float(row["submit_time"]), row["num_gpu"], row["duration"], row.get("vc", "")
    )


def _philly_digest(index: int, row: dict[str, str]) -> TraceJob | None:
    submit = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").timestamp()
    return _job(index, submit, row["num_gpus"], row["duration"], row.get("cluster", ""))


def _itp(index: int, row: dict[str, str]) -> TraceJob | None:
    return _job(index, float(row["submission_time"]), row["num_gpu"], row["duration"], "")


def _shift_to_zero(jobs: Iterable[TraceJob]) -> list[TraceJob]:
    jobs = list(jobs)
    if not jobs:
        return []
    first = jobs[0].submit_s
    return [
        TraceJob(i, j.submit_s - first, j.num_gpus, j.duration_s, j.queue)
        for i, j in enumerate(jobs)
    ]
