"""Time `POST /v1/estimate` on a loaded store: the issue asks for an answer within 100 ms.

The store (a SQLite file) gets `--nodes` nodes of 8 GPUs, `--finished` succeeded jobs of
a few users and names (the predictor's history), `--running` jobs holding GPUs and
`--pending` waiting ones. Each estimate runs the whole path: the body validated, history
brought up to date, every active job predicted, one scheduling pass with the candidate.
The first call loads the history; the median and worst of the next `--repeat` are the
steady state.

    .venv/bin/python -m bench.estimate_latency --finished 2000 --running 100 --pending 200
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from scheduler.model import JobState, Node
from scheduler.store import JobRepository, NewJob, make_engine, upgrade_to_head

BODY = {
    "name": "probe",
    "parallelism": {"dp": 8},
    "entrypoint": {"kind": "function", "target": "workers.examples:allreduce_ranks"},
}


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def fill(repo: JobRepository, clock: Clock, args: argparse.Namespace) -> None:
    nodes = [Node(f"id-{i:03d}", f"gpu-{i:03d}", 8, 64.0) for i in range(args.nodes)]
    repo.replace_nodes(nodes)
    total = args.finished + args.running + args.pending
    for i in range(total):
        name, user = f"job{i % 7}", f"user{i % 5}"
        spec = {**BODY, "name": name, "user": user}
        job = repo.create(
            NewJob(name=name, queue="default", user=user, priority=0, spec=spec, num_gpus=8,
                   total_steps=None)
        )  # fmt: skip
        if i >= args.finished + args.running:
            continue
        placement = [nodes[i % len(nodes)].id] * 8
        repo.transition(job.id, JobState.ADMITTED, reason="b", placement=placement)
        repo.transition(job.id, JobState.STARTING, reason="b")
        repo.transition(job.id, JobState.RUNNING, reason="b")
        if i < args.finished:
            clock.now += timedelta(seconds=60 + i % 300)
            repo.transition(job.id, JobState.SUCCEEDED, reason="b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--finished", type=int, default=2000)
    parser.add_argument("--running", type=int, default=100)
    parser.add_argument("--pending", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade_to_head(url)
        clock = Clock()
        repo = JobRepository(make_engine(url), clock=clock)
        fill(repo, clock, args)
        client = TestClient(create_app(repo))
        started = time.perf_counter()
        first = client.post("/v1/estimate", json=BODY)
        first_ms = (time.perf_counter() - started) * 1000
        assert first.status_code == 200, first.text
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            answer = client.post("/v1/estimate", json=BODY)
            times.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, answer.text
        estimate = answer.json()
    print(
        f"{args.nodes} nodes, {args.finished} finished, {args.running} running, "
        f"{args.pending} pending jobs"
    )
    print(f"first estimate (loads history): {first_ms:.0f} ms")
    print(
        f"next {args.repeat}: median {statistics.median(times):.1f} ms, worst {max(times):.1f} ms"
    )
    print(f"answer: {estimate['prediction']['source']}, start {estimate['estimated_start_at']}")


if __name__ == "__main__":
    main()
