"""Time one pass of the pure scheduling core on a large synthetic cluster and queue.

.venv/bin/python -m bench.schedule_pass --nodes 128 --gpus-per-node 8 --pending 1000
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from scheduler.core import Admit, schedule
from scheduler.model import ClusterSnapshot, GangShape, JobState, JobView, Node, Parallelism


def make_jobs(count: int, seed: int) -> list[JobView]:
    rng = random.Random(seed)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    jobs = []
    for job_id in range(1, count + 1):
        tp = rng.choice([1, 1, 1, 2, 4, 8])
        dp = rng.choice([1, 1, 2, 4, 8])
        jobs.append(
            JobView(
                id=job_id,
                priority=rng.randint(0, 3),
                submitted_at=t0 + timedelta(seconds=job_id),
                state=JobState.PENDING,
                shape=GangShape(Parallelism(dp=dp, tp=tp)),
            )
        )
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    nodes = tuple(
        Node(f"n{i:04d}", f"node-{i}", args.gpus_per_node, 96.0) for i in range(args.nodes)
    )
    jobs = make_jobs(args.pending, seed=0)
    now = datetime(2026, 1, 2, tzinfo=UTC)
    timings = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        decisions = schedule(ClusterSnapshot(nodes), jobs, now)
        timings.append(time.perf_counter() - started)
    admitted = sum(isinstance(d, Admit) for d in decisions)
    print(
        f"{args.nodes} nodes x {args.gpus_per_node} GPUs, {args.pending} pending jobs: "
        f"{admitted} admitted; pass median {statistics.median(timings) * 1000:.1f} ms, "
        f"max {max(timings) * 1000:.1f} ms over {args.repeat} runs"
    )


if __name__ == "__main__":
    main()
