"""How long a rank takes to be ready, sandboxed or not: the cost of the sandbox at launch.

Starts `--ranks` rank supervisors at once on a local Ray (logical GPUs), each with a
built-in trainer rank (its program imports torch and the engine before it says it is
ready), and times until every program has said so. Alternates a sandboxed gang
(bubblewrap, an unprivileged uid) with one whose sandbox is off, `--rounds` times, and
prints each and the median ratio.

    .venv/bin/python -m bench.rank_start --ranks 4 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from scheduler.runtime.local_ray import LocalClusterShape, ray_directory, start_local_cluster
from workers.launch import BuiltinRun, JobLaunch, RankInfo, SandboxMode
from workers.supervisor.actor import RankSupervisor


def start_gang(ranks: int, sandbox: SandboxMode, job_id: int) -> float:
    """Seconds from asking for `ranks` supervisors to every program being ready."""
    launch = JobLaunch(
        job_id=job_id,
        attempt=1,
        user="bench",
        run=BuiltinRun(fields={"model": "gpt-tiny", "steps": 1}),
        sandbox=sandbox,
    )
    remote_cls = ray.remote(RankSupervisor)
    began = time.monotonic()
    actors = [
        remote_cls.options(num_gpus=1, num_cpus=0, max_concurrency=4).remote(
            launch, RankInfo(rank=r, world_size=ranks, local_rank=r, dp=ranks, tp=1, pp=1)
        )
        for r in range(ranks)
    ]
    while not all(s["program_ready"] for s in ray.get([a.status.remote() for a in actors])):
        time.sleep(0.05)
    elapsed = time.monotonic() - began
    for actor in actors:
        ray.kill(actor)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        shape = LocalClusterShape(num_nodes=1, gpus_per_node=args.ranks)
        cluster: Any = start_local_cluster(shape, ray_directory(Path(scratch)))
        try:
            times: dict[SandboxMode, list[float]] = {SandboxMode.REQUIRED: [], SandboxMode.OFF: []}
            for round_ in range(args.rounds):
                for index, mode in enumerate(times):
                    times[mode].append(start_gang(args.ranks, mode, 10 * round_ + index))
                    time.sleep(1.0)  # let the killed workers exit before the next gang
            for mode, runs in times.items():
                listed = ", ".join(f"{t:.1f}" for t in runs)
                print(f"sandbox {mode.value}: median {statistics.median(runs):.1f} s ({listed})")
            ratio = statistics.median(times[SandboxMode.REQUIRED]) / statistics.median(
                times[SandboxMode.OFF]
            )
            print(f"{args.ranks} ranks: sandboxed / unsandboxed = {ratio:.2f}x")
        finally:
            ray.shutdown()
            cluster.shutdown()


if __name__ == "__main__":
    main()
