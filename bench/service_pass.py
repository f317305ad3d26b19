"""A scheduling pass in the service against the pure core's pass on the same jobs (issue 15).

The store (SQLite file by default, or `--database-url`) gets `--running` jobs, which the
loop itself admits and a fake executor reports RUNNING, then `--pending` jobs that mostly
wait (gang sizes from the Philly digest, as `bench/schedule_pass.py` draws them), and
`--finished` succeeded jobs (fair share and history read them). The loop runs on a fake
cluster of `--nodes` x 8 GPUs with the leader lease on (every write fenced), as `gangway
serve` runs it, minus Ray.

Timed, in one process, one run:
- the first pass over the new queue (every wait explained and written once);
- `--repeat` steady passes (nothing changed since the last pass: what a pass costs while
  a big queue waits), and `--repeat` passes after `--churn` submits each (a busy API);
- the core: `scheduler.core.schedule` called `--repeat` times on exactly the arguments the
  loop's last steady pass gave it.

    .venv/bin/python -m bench.service_pass --nodes 1000 --running 2000 --pending 10000
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench.schedule_pass import QUEUES, TRACE, USERS, trace_sizes
from gangway.models import JobSubmit
from scheduler.core import schedule
from scheduler.model import Condition, JobState, Node
from scheduler.runtime import loop as loop_module
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.loop import SchedulerLoop
from scheduler.store import JobRecord, JobRepository, NewJob, make_engine, upgrade_to_head

STEP_S = 0.2


@dataclass
class RunsEverything:
    """An executor whose groups start at once and run until released; with `progress`,
    every running gang reports a step every `STEP_S` (a busy cluster's telemetry: a new
    step at nearly every poll)."""

    progress: bool = False
    statuses: dict[int, GroupStatus] = field(default_factory=dict)
    launched: dict[int, float] = field(default_factory=dict)

    def launch(self, job: JobRecord) -> None:
        self.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, ranks_started=True)
        self.launched[job.id] = time.monotonic()

    def attach(self, job: JobRecord) -> bool:
        return job.id in self.statuses

    def stop(self, job_id: int) -> None:
        self.statuses[job_id] = GroupStatus(GroupPhase.SUCCEEDED, True, stop_seen=True)

    def poll(self) -> dict[int, GroupStatus]:
        if not self.progress:
            return dict(self.statuses)
        now = time.monotonic()
        return {
            job_id: replace(status, **self._progress(job_id, now))
            if status.phase is GroupPhase.RUNNING
            else status
            for job_id, status in self.statuses.items()
        }

    def _progress(self, job_id: int, now: float) -> dict[str, float]:
        """A step every `STEP_S` since launch: a steady trainer's reports."""
        step = int((now - self.launched[job_id]) / STEP_S) + 1
        return {"step": step, "loss": 2.0, "tokens_per_s": 1e4, "step_time_s": STEP_S}

    def release(self, job_id: int) -> None:
        self.statuses.pop(job_id, None)

    def job_ids(self) -> set[int]:
        return set(self.statuses)

    def stacks(self, job_id: int) -> str:
        return ""

    def reap(self, job: JobRecord) -> None:
        self.release(job.id)

    def sweep(self, active: object) -> list[tuple[int, int]]:
        return []

    def forget(self) -> None:
        self.statuses.clear()


@dataclass
class StaticCluster:
    nodes_: list[Node]

    def nodes(self) -> list[Node]:
        return list(self.nodes_)


def body(gpus: int, rng: random.Random, index: int) -> dict[str, Any]:
    """A built-in trainer job of `gpus` GPUs: tp the largest of 1/2/4/8 dividing it."""
    tp = max(t for t in (1, 2, 4, 8) if gpus % t == 0)
    return JobSubmit.model_validate(
        {
            "name": f"bench-{index}",
            "queue": rng.choice(list(QUEUES)),
            "user": rng.choice(USERS),
            "priority": rng.randint(0, 5),
            "parallelism": {"dp": gpus // tp, "tp": tp},
            "time_limit_s": rng.choice([None, 1800, 3600, 8 * 3600]),
            "entrypoint": {"kind": "builtin", "steps": 10_000},
        }
    ).model_dump(mode="json")


def submit(
    repo: JobRepository,
    sizes: list[int],
    count: int,
    rng: random.Random,
    after: Sequence[int] = (),
) -> list[int]:
    """`count` jobs; with `after`, each waits for the success of one of those jobs."""
    ids = []
    for index in range(count):
        gpus = rng.choice(sizes)
        spec = body(gpus, rng, index)
        upstream = ((rng.choice(after), Condition.SUCCEEDED),) if after else ()
        new = NewJob(
            spec["name"], spec["queue"], spec["priority"], spec, gpus, 10_000, depends_on=upstream
        )
        ids.append(repo.create(new).id)
    return ids


def finish(repo: JobRepository, job_ids: list[int]) -> None:
    """Run each job through to SUCCEEDED (history for fair share and predictions)."""
    for job_id in job_ids:
        for state in (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING):
            repo.transition(job_id, state, reason="bench")
        repo.transition(job_id, JobState.SUCCEEDED, reason="bench", step=10_000)


class CoreCalls:
    """Wraps the loop's `schedule`: keeps the arguments and the time of each call."""

    def __init__(self) -> None:
        self.last: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self.seconds: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.last = (args, kwargs)
        started = time.perf_counter()
        try:
            return schedule(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - started)


def timed(
    call: Callable[[], object], repeat: int, before: Callable[[], object] = int
) -> list[float]:
    times = []
    for _ in range(repeat):
        before()
        gc.collect()
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1e3:7.1f} ms, max {max(values) * 1e3:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--running", type=int, default=2000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--finished", type=int, default=1000)
    parser.add_argument("--churn", type=int, default=20, help="submits before each busy pass")
    parser.add_argument(
        "--held",
        type=int,
        default=0,
        help="of the pending jobs, this many wait for a running job's success (depends_on)",
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--progress", action="store_true", help="every running gang reports a step each pass"
    )
    parser.add_argument("--profile", type=int, default=0, help="print the top N of a pass")
    args = parser.parse_args()

    url = args.database_url or f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    upgrade_to_head(url)
    repo = JobRepository(make_engine(url))
    sizes = [gpus for gpus in trace_sizes(TRACE) if gpus <= 64]
    nodes = [
        Node(f"node-{i}", f"gpu-{i}", 8, 64.0, rack=f"rack-{i // 32}") for i in range(args.nodes)
    ]
    core = CoreCalls()
    loop_module.schedule = core  # type: ignore[assignment]  # the loop's own call, timed
    lease = LeaderLease(repo, ttl_s=60)
    loop = SchedulerLoop(
        repo=repo,
        cluster=StaticCluster(nodes),
        executor=RunsEverything(progress=args.progress),
        lease=lease,
        queues=lambda: QUEUES,
    )
    lease.start()  # renewed by its own thread, as in the service: a long pass stays fenced
    try:
        run(args, repo, loop, sizes, core)
    finally:
        lease.stop()


def run(
    args: argparse.Namespace,
    repo: JobRepository,
    loop: SchedulerLoop,
    sizes: list[int],
    core: CoreCalls,
) -> None:
    rng = random.Random(args.seed)

    started = time.perf_counter()
    finish(repo, submit(repo, sizes, args.finished, rng))
    submit(repo, sizes, args.running, rng)
    assert loop.lead()
    for _ in range(4):  # admit, start, run
        loop.tick()
    running = [job.id for job in repo.in_states([JobState.RUNNING])]
    submit(repo, sizes, args.pending - args.held, rng)
    submit(repo, sizes, args.held, rng, after=running)
    print(
        f"store: {args.finished} finished, {len(running)} running on {args.nodes} x 8 GPUs, "
        f"{args.pending} submitted ({args.held} waiting for a running job); "
        f"filled in {time.perf_counter() - started:.0f} s"
    )

    first = timed(loop.tick, 1)
    loop.tick()  # whatever the first pass admitted starts
    waiting = len(repo.in_states([JobState.PENDING]))
    steady = timed(loop.tick, args.repeat)
    steady_core = core.seconds[-args.repeat :]
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(loop.tick)  # one more steady pass
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.profile)
    assert core.last is not None
    call_args, call_kwargs = core.last
    alone = timed(lambda: schedule(*call_args, **call_kwargs), args.repeat)
    busy = timed(loop.tick, args.repeat, before=lambda: submit(repo, sizes, args.churn, rng))

    print(f"pending in the steady passes: {waiting}")
    print(f"first pass over the new queue: {ms(first)}")
    print(f"service pass, steady:          {ms(steady)}")
    print(f"  of which the core's call:    {ms(steady_core)}")
    print(f"service pass, {args.churn} new jobs each: {ms(busy)}")
    print(f"core alone, same arguments:    {ms(alone)}")
    ratio = statistics.median(steady) / statistics.median(alone)
    print(f"ratio service/core (steady medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
