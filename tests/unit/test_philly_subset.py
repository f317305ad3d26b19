"""bench/philly_subset.py cuts held-out Philly traces as the shared subsets were cut."""

from __future__ import annotations

from datetime import datetime

from bench.philly_subset import normalised, subset


def row(stamp: str, duration: float, gpus: int, vc: str = "a") -> dict[str, str]:
    return {"timestamp": stamp, "duration": str(duration), "num_gpus": str(gpus), "cluster": vc}


ROWS = [  # the digest is not sorted by submit time
    row("2017-11-13 00:10:00", 600, 1, "b"),
    row("2017-11-12 23:59:59", 900, 1),  # before the start
    row("2017-11-13 00:05:00", 59, 1),  # ran under 60 s
    row("2017-11-13 00:01:00", 3600, 16),
    row("2017-11-13 00:20:30", 120.7, 2),
    row("2017-11-13 00:30:00", 60, 4),
]
START = datetime(2017, 11, 13)


def test_the_first_jobs_from_the_start_that_ran_a_minute_in_submit_order() -> None:
    lines = normalised(subset(ROWS, START, 3, None))
    assert lines == [
        "job_id,submit_time,num_gpu,duration,vc",
        "0,0,16,3600,a",
        "1,540,1,600,b",
        "2,1170,2,120,a",
    ]


def test_a_gpu_bound_keeps_only_the_smaller_jobs() -> None:
    jobs = subset(ROWS, START, 10, 8)
    assert [j.gpus for j in jobs] == [1, 2, 4]
    assert normalised(jobs)[1] == "0,0,1,600,b"
