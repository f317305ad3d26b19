"""Time full passes of the pure scheduling core on a large cluster and queue.

Gang sizes are drawn from the Philly trace digest (1 to 64 GPUs); a gang of g GPUs gets the
largest tp in {1, 2, 4, 8} that divides g; 10% are elastic. Jobs belong to 4 queues
(1,500 GPUs guaranteed + 2,500 borrowable each) and 20 users with random recent usage.
The cluster first runs `--running` jobs (placed by the core itself, with time limits or
measured progress), then each pending-queue size is timed over `--repeat` passes (a
garbage collection before each, none forced inside).

    .venv/bin/python -m bench.schedule_pass --nodes 1000 --running 2000 \\
        --pending 100 1000 10000 --repeat 10
"""

from __future__ import annotations

import argparse
import csv
import gc
import random
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from scheduler.core import Admit, PolicyConfig, Preempt, free_capacity, place_gang, schedule
from scheduler.core.decisions import Resize
from scheduler.core.placement import FreePool, rack_labels, usage
from scheduler.model import (
    ClusterSnapshot,
    GangShape,
    JobState,
    JobView,
    Node,
    QueueQuota,
    RunInfo,
)
from scheduler.sim.jobs import shape_for as trace_shape

TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/philly/philly_digest.csv"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def trace_sizes(path: Path) -> list[int]:
    with path.open() as handle:
        sizes = (int(row["num_gpus"]) for row in csv.DictReader(handle))
        return [gpus for gpus in sizes if gpus <= 64]


QUEUES = {f"q{i}": QueueQuota(guaranteed_gpus=1500, borrow_limit_gpus=2500) for i in range(4)}
USERS = [f"user{i}" for i in range(20)]


def shape_for(gpus: int, *, elastic: bool = False) -> GangShape:
    """The simulator's gang for a trace job of `gpus` GPUs; an elastic one may shrink to
    one replica."""
    shape = trace_shape(gpus, gpus_per_node=8)
    dp = shape.parallelism.dp
    return replace(shape, dp_min=1, dp_max=dp) if elastic and dp > 1 else shape


def running_jobs(
    nodes: tuple[Node, ...], sizes: list[int], count: int, rng: random.Random
) -> list[JobView]:
    jobs: list[JobView] = []
    pool = FreePool(free_capacity(nodes, []), rack_labels(nodes))
    for job_id in range(1, count + 1):
        shape = shape_for(rng.choice(sizes), elastic=rng.random() < 0.1)
        placement = place_gang(shape, pool)
        if placement is None:
            break
        for node_id, cap in usage(shape, placement).items():
            pool.take(node_id, cap.gpus, cap.cpus)
        started = NOW - timedelta(seconds=rng.randint(60, 86_400))
        jobs.append(
            JobView(
                id=job_id,
                priority=rng.randint(0, 3),
                submitted_at=started - timedelta(seconds=30),
                state=JobState.RUNNING,
                shape=shape,
                placement=placement,
                time_limit_s=rng.choice([None, 3600.0, 4 * 3600.0, 24 * 3600.0]),
                run=RunInfo(
                    started,
                    step=rng.randint(0, 5000),
                    total_steps=10_000,
                    step_time_s=rng.uniform(0.2, 2.0),
                ),
                queue=rng.choice(list(QUEUES)),
                user=rng.choice(USERS),
            )
        )
    return jobs


def pending_jobs(sizes: list[int], count: int, first_id: int, rng: random.Random) -> list[JobView]:
    return [
        JobView(
            id=first_id + index,
            priority=rng.randint(0, 5),
            submitted_at=NOW - timedelta(seconds=rng.randint(0, 7 * 86_400)),
            state=JobState.PENDING,
            shape=shape_for(rng.choice(sizes), elastic=rng.random() < 0.1),
            time_limit_s=rng.choice([None, 1800.0, 3600.0, 8 * 3600.0]),
            queue=rng.choice(list(QUEUES)),
            user=rng.choice(USERS),
        )
        for index in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--rack-size", type=int, default=32, help="nodes per rack label")
    parser.add_argument("--running", type=int, default=2000)
    parser.add_argument("--pending", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--trace", type=Path, default=TRACE)
    args = parser.parse_args()
    rng = random.Random(0)
    sizes = trace_sizes(args.trace)
    nodes = tuple(
        Node(f"n{i:04d}", f"node-{i}", args.gpus_per_node, 96.0, rack=f"r{i // args.rack_size}")
        for i in range(args.nodes)
    )
    running = running_jobs(nodes, sizes, args.running, rng)
    used = sum(j.shape.num_gpus for j in running)
    print(
        f"{args.nodes} nodes x {args.gpus_per_node} GPUs in racks of {args.rack_size}; "
        f"{len(running)} running jobs on "
        f"{used} GPUs; sizes from {args.trace.name} ({len(sizes)} jobs <= 64 GPUs)"
    )
    usage = {(q, u): rng.uniform(0, 1e7) for q in QUEUES for u in USERS}
    for count in args.pending:
        jobs = running + pending_jobs(sizes, count, 1_000_000, rng)
        timings = []
        for _ in range(args.repeat):
            gc.collect()  # start each pass on a clean heap, as the idle loop would
            started = time.perf_counter()
            decisions = schedule(
                ClusterSnapshot(nodes), jobs, NOW, PolicyConfig(), queues=QUEUES, usage=usage
            )
            timings.append(time.perf_counter() - started)
        timings.sort()
        admits = sum(isinstance(d, Admit) for d in decisions)
        preempts = sum(isinstance(d, Preempt) for d in decisions)
        resizes = sum(isinstance(d, Resize) for d in decisions)
        p95 = timings[min(len(timings) - 1, round(0.95 * (len(timings) - 1)))]
        print(
            f"pending {count:>6}: median {statistics.median(timings) * 1000:7.1f} ms, "
            f"p95 {p95 * 1000:7.1f} ms ({args.repeat} passes); {admits} admitted, "
            f"{preempts} preempted, {resizes} resized"
        )


if __name__ == "__main__":
    main()
