"""Soak: random faults for a fixed number of cycles, the fault suite's invariants after each.

Starts a local Ray (two nodes x 4 logical GPUs, the service's external Ray) and one
`gangway serve` on a SQLite file. Each cycle submits a counting job that checkpoints every
5 steps (`workers.examples:checkpointed_steps`), injects one fault drawn at random from
the kinds below, waits for every job to end, and runs the invariant check of
`bench/harness/invariants.py` (no job lost, none run twice, nothing stranded on Ray, GPUs
accounted, steps lost <= the interval). Prints the cycles, the faults of each kind and the
violations.

    .venv/bin/python -m bench.soak --cycles 6 --seed 1
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from bench.harness.faults import (
    EVERY,
    killed_by_fault,
    make_service,
    submit_counter,
    wait_state,
    wait_until_step,
)
from bench.harness.invariants import finished, violations
from bench.harness.service import Service
from gangway import Client
from scheduler.runtime.local_ray import LocalClusterShape, ray_directory, start_local_cluster


def service_kill9_admitted(service: Service, client: Client) -> int:
    service.stop()
    service.env["GANGWAY_FAULTS"] = "scheduler.launched:kill@1"
    client = service.start()
    job = submit_counter(client, steps=15)
    killed_by_fault(service)
    return job.id


def service_kill9_starting(service: Service, client: Client) -> int:
    job = submit_counter(client, steps=15)
    wait_state(client, job.id, "STARTING")
    service.stop(signal.SIGKILL)
    return job.id


def service_kill9_running(service: Service, client: Client) -> int:
    job = submit_counter(client, steps=25)
    wait_state(client, job.id, "stepping")
    service.stop(signal.SIGKILL)
    return job.id


def rank_sigkill(service: Service, client: Client) -> int:
    job = submit_counter(client, steps=20, max_restarts=1)
    wait_until_step(client, job.id, EVERY + 2)
    actor = ray.get_actor(f"gangway-job{job.id}-attempt1-rank1", namespace="gangway")
    os.kill(ray.get(actor.status.remote())["pid"], signal.SIGKILL)
    return job.id


def rank_kill_mid_save(service: Service, client: Client) -> int:
    service.stop()
    service.env["GANGWAY_FAULTS"] = "checkpoint.save:kill@2"
    client = service.start()
    return submit_counter(client, steps=12, max_restarts=1).id


FAULTS: dict[str, Callable[[Service, Client], int]] = {
    fault.__name__: fault
    for fault in (
        service_kill9_admitted,
        service_kill9_starting,
        service_kill9_running,
        rank_sigkill,
        rank_kill_mid_save,
    )
}


def soak(cycles: int, seed: int, data_dir: Path) -> None:
    rng = random.Random(seed)
    directory = ray_directory(data_dir / "cluster")
    cluster: Any = start_local_cluster(LocalClusterShape(num_nodes=2, gpus_per_node=4), directory)
    service = make_service(data_dir, cluster)
    kinds: Counter[str] = Counter()
    found: list[str] = []
    job_ids: list[int] = []
    started = time.monotonic()
    try:
        client = service.start()
        for cycle in range(1, cycles + 1):
            kind = rng.choice(sorted(FAULTS))
            kinds[kind] += 1
            job_ids.append(FAULTS[kind](service, client))
            service.stop()  # a killed service is gone already; a live one stops cleanly
            service.env.pop("GANGWAY_FAULTS", None)
            client = service.start()
            finished(client, job_ids)
            report = violations(client, job_ids, data_dir / "checkpoints", EVERY)
            deadline = time.monotonic() + 30
            while report.violations and time.monotonic() < deadline:
                time.sleep(0.5)
                report = violations(client, job_ids, data_dir / "checkpoints", EVERY)
            found += [f"cycle {cycle} ({kind}): {v}" for v in report.violations]
            print(f"cycle {cycle}: {kind}; {len(report.violations)} violation(s)", flush=True)
    finally:
        service.stop()
        ray.shutdown()
        cluster.shutdown()
    elapsed = time.monotonic() - started
    print(f"cycles: {cycles} in {elapsed:.0f} s (seed {seed})")
    for kind in sorted(FAULTS):
        print(f"  {kind}: {kinds[kind]}")
    print(f"violations: {len(found)}")
    for line in found:
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gangway-soak-") as tmp:
        soak(args.cycles, args.seed, Path(tmp))


if __name__ == "__main__":
    main()
