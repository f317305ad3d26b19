"""Time the status page's fragments on a large store: what one browser refresh costs the
service with 1,000 jobs and 100 nodes (the size issue 8 asks the page to stay usable at).

The store (SQLite file, or --database-url) gets `--nodes` nodes of 8 GPUs, `--running` jobs
placed on them with `--points` metric points each, `--pending` jobs with explanations, and
finished jobs up to `--jobs` in all, each with its metric points. Each fragment is fetched
`--repeat` times through the real app (Starlette's TestClient, no network); the median and
worst are printed, with the size of the HTML.

    .venv/bin/python -m bench.status_page --jobs 1000 --nodes 100 --repeat 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import insert

from api.app import create_app
from scheduler.model import JobState, Node
from scheduler.store import JobRepository, NewJob, ProgressPoint, make_engine, upgrade_to_head
from scheduler.store.tables import JobMetricRow

SPEC = {
    "name": "bench",
    "parallelism": {"dp": 8, "tp": 1, "pp": 1},
    "resources": {"gpus_per_rank": 1, "cpus_per_rank": 1.0},
    "entrypoint": {"kind": "builtin", "steps": 1000},
}


def add_points(repo: JobRepository, job_id: int, count: int) -> None:
    """`count` metric points in one statement (what `record_progress` writes one poll at a
    time), then the latest as the job's progress."""
    at = repo.now()
    rows = [
        {"job_id": job_id, "attempt": 1, "step": step, "at": at, "loss": 10 / step,
         "tokens_per_s": 1e5, "step_time_s": 0.1, "memory_mb": 1000.0}
        for step in range(1, count)
    ]  # fmt: skip
    with repo.engine.begin() as conn:
        conn.execute(insert(JobMetricRow), rows)
    repo.record_progress(job_id, 1, ProgressPoint(count, loss=10 / count, tokens_per_s=1e5))


def fill(repo: JobRepository, args: argparse.Namespace) -> int:
    nodes = [Node(f"id-{i:03d}", f"gpu-{i:03d}", 8, 64.0) for i in range(args.nodes)]
    repo.replace_nodes(nodes)
    new = NewJob(name="job", queue="default", priority=0, spec=SPEC, num_gpus=8, total_steps=1000)
    finished = args.jobs - args.running - args.pending
    for i in range(args.jobs):
        job_id = repo.create(new).id
        if i < finished + args.running:
            placement = [nodes[i % len(nodes)].id] * 8
            for state in (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING):
                repo.transition(job_id, state, reason="bench", placement=placement)
            add_points(repo, job_id, args.points)
            if i < finished:
                repo.transition(job_id, JobState.SUCCEEDED, reason="bench")
        else:
            why = {"blocker": "cluster_full", "message": "needs 8 GPUs", "unblock": "u"}
            why["queue_position"] = args.jobs - i
            at = repo.now() + timedelta(hours=1)
            repo.explain_wait(job_id, "needs 8 GPUs", explanation=why, estimated_start_at=at)
    return job_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--running", type=int, default=100)
    parser.add_argument("--pending", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--points", type=int, default=2000, help="metric points per started job")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    url = args.database_url or f"sqlite:///{Path(tempfile.mkdtemp()) / 'bench.db'}"
    upgrade_to_head(url)
    repo = JobRepository(make_engine(url))
    started = time.perf_counter()
    running_id = fill(repo, args) - args.pending
    print(
        f"store: {args.jobs} jobs ({args.running} running, {args.pending} pending), "
        f"{args.nodes} nodes, {args.points} points per started job; filled in "
        f"{time.perf_counter() - started:.0f} s ({url.split(':')[0]})"
    )
    paths = [
        "/ui/cluster",
        "/ui/queue",
        "/ui/jobs",
        f"/ui/jobs/{running_id}/summary",
        f"/ui/jobs/{running_id}/charts",
        f"/ui/jobs/{running_id}/events",
    ]
    with TestClient(create_app(repo)) as client:
        print(f"{'fragment':<28} {'median ms':>10} {'max ms':>8} {'KiB':>6}")
        for path in paths:
            times, size = [], 0
            for _ in range(args.repeat):
                begin = time.perf_counter()
                response = client.get(path)
                times.append((time.perf_counter() - begin) * 1000)
                size = len(response.content)
                assert response.status_code == 200, (path, response.status_code)
            name = path.replace(str(running_id), "{id}")
            print(
                f"{name:<28} {statistics.median(times):>10.1f} {max(times):>8.1f} "
                f"{size / 1024:>6.1f}"
            )


if __name__ == "__main__":
    main()
