"""Submit throughput and read latency as users see them (issue 15): PostgreSQL, auth on
(a user's API key, looked up per request), the scheduler loop running, one job holding
all 8 GPUs (so every submitted dp=1 job stays pending and each pass sees all of them),
`--stored` finished jobs already in the store.

For each of `--clients` (default 16 and 64) that many concurrent clients submit with an
Idempotency-Key each for `--seconds`; then the store is filled up to `--read-stored`
jobs and GET /v1/jobs/{id} (every submitted id: each must be readable) and
GET /v1/jobs?limit=50 are timed with 16 clients. The service runs in a subprocess
(uvicorn, as `gangway serve` runs it, with a fake cluster and executor in place of Ray),
the clients here (httpx, asyncio).

    GANGWAY_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:5432/gw \\
        .venv/bin/python -m bench.submit_load --stored 10000 --read-stored 100000

`--profile out.txt` samples the service with py-spy during the first submit phase and
prints the functions it spent the most time in.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import sqlalchemy as sa

ADMIN_KEY = "bench-submit-load-admin-key"
HOLDER: dict[str, object] = {
    "name": "holder",
    "parallelism": {"dp": 8},
    "entrypoint": {"kind": "builtin", "steps": 10_000_000},
}


def stored_spec(body: dict[str, object]) -> dict[str, object]:
    """A body as the API stores it: every default filled in."""
    from gangway.models import JobSubmit

    return JobSubmit.model_validate(body).model_dump(mode="json")


def submit_body(i: int) -> dict[str, object]:
    return {"name": f"load-{i}", "entrypoint": {"kind": "builtin", "steps": 100}}


# -- the service (subprocess) ---------------------------------------------------------


def serve(database_url: str, port: int) -> None:
    """The app as `gangway serve` builds it, with the loop on a fake 8-GPU node whose
    one RUNNING job (the holder) never ends."""
    import uvicorn

    from api.app import create_app
    from api.auth import AuthConfig
    from scheduler.model import JobState, Node
    from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
    from scheduler.runtime.lease import LeaderLease
    from scheduler.runtime.loop import SchedulerLoop
    from scheduler.store import JobRepository, make_engine

    repo = JobRepository(make_engine(database_url))
    holder = repo.in_states([JobState.RUNNING])[0].id
    node = Node("node-0", "gpu-0", 8, 64.0)

    class OneNode:
        def nodes(self) -> list[Node]:
            return [node]

    @dataclass
    class HolderOnly:
        """An executor whose only group is the holder, running."""

        running: dict[int, GroupStatus] = field(
            default_factory=lambda: {holder: GroupStatus(GroupPhase.RUNNING, ranks_started=True)}
        )

        def launch(self, job: object) -> None:
            raise RuntimeError("the bench never admits a job: the holder has every GPU")

        def attach(self, job: object) -> bool:
            return True

        def stop(self, job_id: int) -> None: ...

        def poll(self) -> dict[int, GroupStatus]:
            return dict(self.running)

        def release(self, job_id: int) -> None: ...

        def job_ids(self) -> set[int]:
            return set(self.running)

        def stacks(self, job_id: int) -> str:
            return ""

        def reap(self, job: object) -> None: ...

        def sweep(self, active: object) -> list[tuple[int, int]]:
            return []

        def forget(self) -> None: ...

    stop, wake = threading.Event(), threading.Event()
    loop = SchedulerLoop(
        repo=repo, cluster=OneNode(), executor=HolderOnly(), lease=LeaderLease(repo, ttl_s=15)
    )
    thread = threading.Thread(
        target=loop.run, args=(stop, 1.0), kwargs={"wake": wake, "busy_interval_s": 0.1}
    )
    thread.start()
    app = create_app(repo, on_change=wake.set, auth=AuthConfig(required=True, admin_key=ADMIN_KEY))
    try:
        # keep-alive as a proxy in front would hold it (uvicorn's 5 s closes connections
        # that a slow moment left idle just as a client reuses them)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=60)
    finally:
        stop.set()
        wake.set()
        thread.join(timeout=30)


# -- the store ------------------------------------------------------------------------


def fresh_schema(base_url: str) -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    return schema, f"{base_url}?options=-csearch_path%3D{schema}"


def drop_schema(base_url: str, schema: str) -> None:
    admin = sa.create_engine(base_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


def seed(database_url: str, *, finished: int) -> None:
    """The holder (RUNNING on all 8 GPUs) and `finished` SUCCEEDED jobs, in bulk inserts."""
    from scheduler.model import JobState
    from scheduler.store import JobRepository, NewJob, make_engine

    repo = JobRepository(make_engine(database_url))
    if not repo.in_states([JobState.RUNNING]):
        holder = repo.create(
            NewJob(name="holder", queue="default", priority=0, spec=stored_spec(HOLDER), num_gpus=8,
                   total_steps=10_000_000)
        )  # fmt: skip
        for state in (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING):
            repo.transition(holder.id, state, reason="bench", placement=["node-0"] * 8)
    add_finished(repo.engine, finished)
    repo.engine.dispose()


def add_finished(engine: sa.Engine, count: int) -> None:
    """`count` SUCCEEDED jobs with their event, generated by PostgreSQL itself (two
    INSERT ... SELECT statements: 100,000 rows in seconds, not minutes)."""
    import json

    jobs = sa.text(
        """
        INSERT INTO jobs (name, queue, "user", priority, state, spec, num_gpus,
            submitted_at, updated_at, finished_at, status_reason, attempt, restarts, step,
            total_steps, waited_s, attained_gpu_s)
        SELECT 'old-' || n, 'default', 'bench', 0, 'SUCCEEDED', CAST(:spec AS json), 1,
            :done, :done, :done, 'succeeded', 1, 0, 100, 100, 0, 60
        FROM generate_series(1, :count) AS n
        RETURNING id
        """
    )
    events = sa.text(
        """
        INSERT INTO job_events (job_id, at, from_state, to_state, reason)
        SELECT id, :done, NULL, 'SUCCEEDED', 'bench' FROM jobs
        WHERE state = 'SUCCEEDED' AND id >= :first
        """
    )
    done = datetime.now(UTC) - timedelta(hours=1)
    spec = json.dumps(stored_spec(submit_body(0)))
    with engine.begin() as conn:
        ids = conn.execute(jobs, {"spec": spec, "done": done, "count": count}).scalars().all()
        if ids:
            conn.execute(events, {"done": done, "first": min(ids)})


def stored_jobs(database_url: str) -> int:
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        count = conn.execute(sa.text("select count(*) from jobs")).scalar_one()
    engine.dispose()
    return int(count)


# -- the clients ----------------------------------------------------------------------


@dataclass
class Run:
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    ids: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0

    def line(self, what: str, clients: int) -> str:
        ok = self.statuses.get(200, 0) + self.statuses.get(201, 0)
        errors = sum(self.statuses.values()) - ok
        lat = sorted(self.latencies_s)
        p50 = statistics.median(lat) * 1000
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        rate = ok / self.elapsed_s
        return (
            f"{what:<24} clients={clients:<3} {rate:7.1f}/s  p50 {p50:6.1f} ms  "
            f"p99 {p99:6.1f} ms  requests {len(lat)}  errors {errors}"
        )


@asynccontextmanager
async def http(url: str, key: str, clients: int) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=60
    ) as client:
        yield client


TRANSPORT_ERROR = -1  # counted as an error: a reset or refused connection


async def send(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    body: dict[str, object] | None = None,
    idempotency_key: str | None = None,
) -> httpx.Response | None:
    """One request; None when the connection failed (the run goes on and counts it). A
    submit is retried once with its Idempotency-Key, as a client would: a retry returns
    the job the first try made, never a second one."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    for _ in range(2 if idempotency_key else 1):
        try:
            return await client.request(method, path, json=body, headers=headers)
        except httpx.TransportError:
            continue
    return None


async def submit_phase(url: str, key: str, clients: int, seconds: float) -> Run:
    run = Run()
    deadline = time.monotonic() + seconds
    counter = iter(range(10**9))

    async def worker(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            i = next(counter)
            key = f"{uuid.uuid4()}"
            started = time.perf_counter()
            response = await send(client, "POST", "/v1/jobs", submit_body(i), key)
            run.latencies_s.append(time.perf_counter() - started)
            run.statuses[response.status_code if response else TRANSPORT_ERROR] += 1
            if response is not None and response.status_code == 201:
                run.ids.append(response.json()["id"])

    started = time.monotonic()
    async with http(url, key, clients) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    run.elapsed_s = time.monotonic() - started
    return run


async def read_phase(url: str, key: str, paths: list[str], clients: int) -> Run:
    run = Run()
    queue = iter(paths)

    async def worker(client: httpx.AsyncClient) -> None:
        for path in queue:
            started = time.perf_counter()
            response = await send(client, "GET", path)
            run.latencies_s.append(time.perf_counter() - started)
            run.statuses[response.status_code if response else TRANSPORT_ERROR] += 1

    started = time.monotonic()
    async with http(url, key, clients) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    run.elapsed_s = time.monotonic() - started
    return run


def user_key(url: str) -> str:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=url, headers=admin) as client:
        client.post("/v1/users", json={"name": "bench"}).raise_for_status()
        response = client.post("/v1/users/bench/keys")
        response.raise_for_status()
        secret: str = response.json()["secret"]
        return secret


def wait_healthy(url: str, server: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if server.poll() is not None:
            raise SystemExit("the service exited while starting")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit("the service did not answer /healthz in 60 s")


def py_spy() -> str:
    """py-spy from this environment (a dev dependency), else from PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"


def profile_top(raw_path: str, top: int = 25) -> str:
    """Inclusive share of samples per function (file:function) from py-spy's raw stacks."""
    inclusive: Counter[str] = Counter()
    total = 0
    with open(raw_path) as stacks:
        for line in stacks:
            frames, _, count = line.rstrip().rpartition(" ")
            total += int(count)
            names = {frame.split(" (")[0] + " " + frame.rpartition("(")[2].split(":")[0]
                     for frame in frames.split(";")}  # fmt: skip
            for name in names:
                inclusive[name] += int(count)
    rows = [f"{100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    return f"samples: {total}\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("GANGWAY_TEST_POSTGRES_URL"))
    parser.add_argument("--stored", type=int, default=10_000)
    parser.add_argument("--read-stored", type=int, default=100_000)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--reads", type=int, default=3000, help="requests per read phase")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--profile", help="py-spy raw stacks of the first submit phase here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.database_url:
        raise SystemExit("give --database-url or GANGWAY_TEST_POSTGRES_URL (PostgreSQL)")
    if args.serve:
        serve(args.database_url, args.port)
        return

    from scheduler.store import upgrade_to_head

    schema, url = fresh_schema(args.database_url)
    try:
        upgrade_to_head(url)
        started = time.monotonic()
        seed(url, finished=args.stored)
        print(f"seeded {stored_jobs(url)} jobs in {time.monotonic() - started:.1f} s")
        load = os.getloadavg()[0]
        print(f"load average at start: {load:.1f} on {os.cpu_count()} CPUs")
        command = [sys.executable, "-m", "bench.submit_load", "--serve",
                   "--database-url", url, "--port", str(args.port)]  # fmt: skip
        server = subprocess.Popen(command)
        base = f"http://127.0.0.1:{args.port}"
        try:
            wait_healthy(base, server)
            run_all(args, url, base, server)
        finally:
            server.terminate()
            server.wait(timeout=60)
    finally:
        drop_schema(args.database_url, schema)


def run_all(args: argparse.Namespace, url: str, base: str, server: subprocess.Popen[bytes]) -> None:
    key = user_key(base)
    ids: list[int] = []
    for number, clients in enumerate(args.clients):
        spy = None
        if args.profile and number == 0:
            spy = subprocess.Popen(
                [py_spy(), "record", "-p", str(server.pid), "-r", "50", "-f", "raw",
                 "-o", args.profile, "-d", str(int(args.seconds))],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        run = asyncio.run(submit_phase(base, key, clients, args.seconds))
        ids += run.ids
        print(run.line("submit", clients), f"(stored after: {stored_jobs(url)})")
        if spy is not None:
            spy.wait(timeout=120)
            print(profile_top(args.profile))
    more = args.read_stored - stored_jobs(url)
    if more > 0:
        started = time.monotonic()
        add_finished(sa.create_engine(url), more)
        print(f"filled to {stored_jobs(url)} jobs in {time.monotonic() - started:.1f} s")
    gets = [f"/v1/jobs/{job_id}" for job_id in ids]
    get_run = asyncio.run(read_phase(base, key, gets, 16))
    print(get_run.line("GET /v1/jobs/{id}", 16), f"(every submitted id: {len(ids)})")
    lists = ["/v1/jobs?limit=50"] * args.reads
    print(asyncio.run(read_phase(base, key, lists, 16)).line("GET /v1/jobs?limit=50", 16))
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
