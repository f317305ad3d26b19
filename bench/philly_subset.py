"""Held-out Philly traces for `bench/policy_frontier.py`: a subset of the Philly digest cut
the way the shared subsets were (the shared traces' README): the first `--count` jobs
submitted from `--start` on with a run of at least 60 s (`--max-gpus`: only jobs of at
most that many GPUs, as `philly_le8_2000`), in submit order (ties in the digest's order),
normalised to `job_id,submit_time,num_gpu,duration,vc` with the first arrival at 0.

    python bench/philly_subset.py --start 2017-11-13 --count 2000 --out /tmp/philly_1113.csv
    python bench/philly_subset.py --start 2017-12-04 --count 2000 --max-gpus 8 \\
        --out /tmp/philly_le8_1204.csv
    python bench/policy_frontier.py --trace /tmp/philly_1113.csv:12

From 2017-10-09 with 2,000 jobs it gives the shared `philly_2000` up to the order of jobs
submitted in the same second.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

DIGEST = Path(__file__).resolve().parents[1].parent / "shared/traces/philly/philly_digest.csv"
MIN_RUN_S = 60.0


@dataclass(frozen=True)
class DigestJob:
    submitted: datetime
    duration_s: float
    gpus: int
    vc: str


def subset(
    rows: list[dict[str, str]], start: datetime, count: int, max_gpus: int | None
) -> list[DigestJob]:
    """The first `count` jobs submitted at or after `start` that ran >= 60 s (and hold at
    most `max_gpus` GPUs), in submit order; the digest is not sorted."""
    jobs = [
        DigestJob(
            datetime.fromisoformat(r["timestamp"]),
            float(r["duration"]),
            int(r["num_gpus"]),
            r["cluster"],
        )
        for r in rows
    ]
    kept = [
        j
        for j in jobs
        if j.submitted >= start
        and j.duration_s >= MIN_RUN_S
        and (max_gpus is None or j.gpus <= max_gpus)
    ]
    return sorted(kept, key=lambda j: j.submitted)[:count]


def normalised(jobs: list[DigestJob]) -> list[str]:
    """The shared subsets' lines: ids from 0, submit times in seconds from the first."""
    lines = ["job_id,submit_time,num_gpu,duration,vc"]
    first = jobs[0].submitted if jobs else datetime.min
    for index, job in enumerate(jobs):
        offset = int((job.submitted - first).total_seconds())
        lines.append(f"{index},{offset},{job.gpus},{int(job.duration_s)},{job.vc}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--digest", type=Path, default=DIGEST)
    parser.add_argument("--start", type=datetime.fromisoformat, required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--max-gpus", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with args.digest.open() as handle:
        jobs = subset(list(csv.DictReader(handle)), args.start, args.count, args.max_gpus)
    if not jobs:
        raise SystemExit(f"no job of the digest was submitted from {args.start} on")
    args.out.write_text("\n".join(normalised(jobs)) + "\n")
    print(f"{len(jobs)} jobs, {jobs[0].submitted} .. {jobs[-1].submitted} -> {args.out}")


if __name__ == "__main__":
    main()
