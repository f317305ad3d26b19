"""Many hosts, no shared disk, a network that fails: `scripts/cluster up --hosts 3` starts
three emulated hosts (network namespaces on a bridge, each with its own address and a
private mount namespace that hides the service's data dir and, since a store is named,
gives each an empty storage dir of its own: they share no folder). Checkpoints, outputs
and model versions go to an S3-compatible server (moto's) on the emulated network,
through the rank supervisors and the service, which alone hold its credentials; a later
job starts from a version of the first one and reads its outputs, fetched from there. A
client ships a working directory (it reaches the hosts through Ray's object store); its
function runs dp=4 over two hosts, checkpointing;
one of them is cut off the network mid-step, and the other's link made lossy (5% each way,
50 Mbit/s). The job restarts on the hosts that remain, its events naming the host that
went silent, resumes from its newest checkpoint and succeeds over the lossy link, and the
fault suite's invariants hold (checked by a driver of the hosts' Ray). `heal`
brings the host back (its Ray node started again). Then the service's own host is cut
off from Ray's head (each host still reaching both) while another job runs: the service
stops once the head declares its node dead, `heal service` starts it again, and the job
succeeds, the invariants holding; then its link to PostgreSQL is cut for longer than its
lease while a third job runs, which succeeds in its first attempt. A small built-in job
across two hosts
then spends far longer in its collectives (its comm_s) on 5 Mbit/s links than on plain
ones, and still succeeds; `down` leaves no process, namespace or link behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from bench.harness.link import CuttableLink
from bench.harness.service import ADMIN_KEY
from gangway import Builtin, Client, Function, Job, JobInfo, JobState, Parallelism, Resources
from tests.e2e.test_cluster import SCRIPT, cluster_command, cluster_env, running_in, workdir

pytestmark = pytest.mark.cluster

STEPS, INTERVAL = 60, 5


def network_left(state: Path) -> str:
    """Namespaces and links the cluster at `state` made, still there (named as the script
    names them, from its state dir's real path)."""
    path = str(state.resolve())
    checksum = subprocess.run(["cksum"], input=path, capture_output=True, text=True, check=True)
    tag = f"{int(checksum.stdout.split()[0]) % 65000:05d}"
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    ours = re.compile(rf"gw{tag}-(?:host-\d+|head)|gwb{tag}[@:]|gwv{tag}h(?:\d+|d)[@:]")
    return "\n".join(ours.findall(spaces.stdout + links.stdout))


def bridge_address(state: Path) -> str:
    """This machine's address on the bridge of the cluster at `state` (as the script
    derives it): what the hosts reach the service's side by."""
    checksum = subprocess.run(
        ["cksum"], input=str(state.resolve()), capture_output=True, text=True, check=True
    )
    tag = int(checksum.stdout.split()[0]) % 65000
    return f"10.{100 + tag % 150}.{tag // 150 % 250}.1"


@pytest.fixture
def s3_server() -> Iterator[int]:
    """An S3-compatible server (moto's) on every address of this machine: the hosts reach
    it over the emulated network, on the bridge."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="0.0.0.0", port=0, verbose=False)
    server.start()
    try:
        yield server.get_host_and_port()[1]
    finally:
        server.stop()


Hosts = tuple[Client, dict[str, str], Path, CuttableLink]


@pytest.fixture
def hosts(postgres_url: str, s3_server: int) -> Iterator[Hosts]:
    assert os.geteuid() == 0, "emulated hosts need root (CI runs as root)"
    state = Path(tempfile.mkdtemp(prefix="gwh-"))
    database = make_url(postgres_url)
    link = CuttableLink((database.host or "127.0.0.1", database.port or 5432))  # cuttable
    endpoint = f"http://{bridge_address(state)}:{s3_server}"
    credentials = {  # the service's and the nodes' (scripts/cluster hands them on)
        "AWS_ACCESS_KEY_ID": "gangway-nodes",
        "AWS_SECRET_ACCESS_KEY": "not-for-ranks",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    # a silent host is dead after 10 s, not Ray's 65; checkpoints in the S3 server
    proxied = database.set(host="127.0.0.1", port=link.port)
    env = cluster_env(
        state,
        proxied.render_as_string(hide_password=False),
        GANGWAY_LEASE_TTL_S="6",
        CLUSTER_DEAD_AFTER_S="10",
        GANGWAY_STORAGE_URL="s3://checkpoints/gangway",
        **credentials,
    )
    import boto3

    s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{s3_server}", **_boto(credentials))
    s3.create_bucket(Bucket="checkpoints")
    try:
        up = subprocess.run(
            [str(SCRIPT), "up", "--hosts", "3"],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        yield Client(up.stdout.strip().splitlines()[-1], api_key=ADMIN_KEY), env, state, link
    finally:
        link.close()
        down = cluster_command("down", env)
        assert down.returncode == 0, down.stdout + down.stderr
        assert running_in(state) == ""
        assert network_left(state) == ""
        shutil.rmtree(state, ignore_errors=True)


def files_are_in_the_store_alone(client: Client, job: int, state: Path, logs: str) -> None:
    """The job's checkpoints and outputs are in the S3 server, none on the hosts' shared
    disk, and no rank saw the store's credentials (the function prints its environment)."""
    saved = client.checkpoints(job)
    assert saved.directory == f"s3://checkpoints/gangway/checkpoints/job-{job}", saved
    assert saved.checkpoints and saved.checkpoints[-1].step == STEPS
    assert all(c.path.startswith("s3://checkpoints/") for c in saved.checkpoints)
    assert not (state / "storage" / "checkpoints" / f"job-{job}").exists()
    assert [(f.path, f.rank) for f in client.outputs(job)] == [("result.txt", 0)]
    [fetched] = client.download(job, "result.txt", to=state / f"out-{job}")
    assert fetched.read_text() == f"trained {STEPS} steps"
    assert not (state / "storage" / "outputs" / f"job-{job}").exists()
    assert "ENV" in logs and "AWS_" not in logs and "not-for-ranks" not in logs


def assert_invariants(jobs: list[int], env: dict[str, str], state: Path) -> None:
    """The fault suite's invariants (no job lost, one attempt on Ray at most and the one
    the store names, nothing stranded, GPUs accounted), checked by a driver of the
    hosts' Ray, which this process is not (it has the test session's)."""
    command = [
        ".venv/bin/python", "-m", "bench.harness.invariants",
        "--ray-address", (state / "address").read_text().strip(),
        "--url", (state / "url").read_text().strip(), "--api-key", ADMIN_KEY,
        *(f"--job={job}" for job in jobs),
    ]  # fmt: skip
    ray_env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(state / "ray_token")}
    done = subprocess.run(
        command, env=ray_env, capture_output=True, text=True, timeout=120, check=False
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def _boto(credentials: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"],
        "region_name": credentials["AWS_DEFAULT_REGION"],
    }


def on(action: str, host: str, env: dict[str, str], *more: str) -> str:
    done = subprocess.run(
        [str(SCRIPT), action, host, *more], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def raylet_of(host: str, state: Path) -> int:
    found = subprocess.run(
        ["pgrep", "-f", f"raylet.*{state}/{host}/"], capture_output=True, text=True, check=False
    )
    return int(found.stdout.split()[0])


@pytest.mark.timeout(900)
def test_a_job_survives_a_host_cut_off_mid_step_on_hosts_that_share_no_disk(
    hosts: Hosts, tmp_path: Path
) -> None:
    client, env, state, _ = hosts
    job = submit_training(client, "across-hosts", tmp_path / "work", STEPS, dp=4, max_restarts=2)
    # each host sees its own filesystem: not the service's data dir (database, packages),
    # nor this machine's storage dir (with a store named, each host's is its own)
    (state / "storage" / "on-this-machine").write_text("not shared")
    host_1 = str(raylet_of("host-1", state))
    for folder in ("service", "storage"):
        hidden = subprocess.run(
            ["nsenter", "-t", host_1, "-m", "ls", "-A", f"{state}/{folder}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert hidden.stdout == "", (folder, hidden.stdout)
    assert any((state / "service" / "packages").iterdir())
    info = running_past(client, job.id, INTERVAL + 3, timeout_s=300)
    first = {p.node_name for p in info.placement}
    assert len(first) == 2, first  # two hosts of two GPUs
    victim = info.placement[-1].node_name
    lossy = info.placement[0].node_name  # stays: the next attempt runs on it, lossy
    on("partition", victim, env)
    cut_at = datetime.now(UTC)
    assert "5% loss" in on("slow", lossy, env, "--loss-pct", "5", "--rate-mbit", "50")

    done = client.wait(job.id, timeout_s=600, poll_s=0.5)
    assert done.state is JobState.SUCCEEDED, done.error
    assert done.attempt == 2 and done.progress.step == STEPS
    assert victim not in {p.node_name for p in done.placement}
    restarted = next(e for e in client.events(job.id) if e.to_state is JobState.RESTARTING)
    assert f"lost node: {victim}" in restarted.reason, restarted.reason
    noticed_s = (restarted.at - cut_at).total_seconds()  # Ray's heartbeats, then ours
    assert 0 < noticed_s < 45, f"the lost host was noticed after {noticed_s:.0f} s"
    text = "\n".join(line.line for line in client.logs(job.id, tail=2000))
    resumed = {int(line.rsplit("starts at ", 1)[1].split()[0]) for line in text.splitlines()
               if "starts at" in line and "starts at 0" not in line}  # fmt: skip
    assert resumed and min(resumed) % INTERVAL == 0 and min(resumed) > 0, text[-2000:]
    files_are_in_the_store_alone(client, job.id, state, text)
    assert_invariants([job.id], env, state)

    assert "a plain link again" in on("slow", lossy, env)
    print(on("heal", victim, env))
    delayed = subprocess.run(
        [str(SCRIPT), "slow", victim, "--delay-ms", "200"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if delayed.returncode == 3:  # a kernel without netem (this machine's) says so
        assert "no netem" in delayed.stderr
    else:
        assert delayed.returncode == 0 and "200 ms delay" in delayed.stdout, delayed.stderr
    on("slow", victim, env)
    deadline = time.monotonic() + 120
    while sum(n.alive for n in client.cluster().nodes) < 3:  # the healed host's node is back
        assert time.monotonic() < deadline, client.cluster()
        time.sleep(1)

    through = the_service_survives_a_cut_from_the_ray_head(client, env, state, tmp_path, job.id)
    the_service_survives_a_cut_from_its_database(client, hosts, tmp_path / "db", [job.id, through])

    # A narrow link slows a gang's collectives and shows in its communication time (the
    # built-in trainer's comm_s), without failing it.
    plain = trainer_comm_s(client, "plain")
    for host in ("host-1", "host-2", "host-3"):
        on("slow", host, env, "--rate-mbit", "5")
    narrow = trainer_comm_s(client, "narrow")
    print(f"comm_s per step: plain links {plain:.4f} s, 5 Mbit/s links {narrow:.4f} s")
    assert narrow > 5 * plain, (plain, narrow)


def the_service_survives_a_cut_from_the_ray_head(
    client: Client, env: dict[str, str], state: Path, tmp_path: Path, earlier: int
) -> int:
    """The service's host cut off from Ray's head (every host still reaches both) while a
    shipped job runs: the head declares the service's node dead after its 10 s check,
    the service sees it and stops (its raylet is gone); `heal service` starts both again,
    as a host's service manager would, and the new service reattaches the running gang.
    It starts from a model version registered from the earlier job's checkpoint and reads
    that job's outputs: both in the store, fetched onto each of its hosts."""
    version = client.register_model("across-hosts", earlier)
    assert version.step == STEPS and not (state / "storage" / "models").exists()
    through = submit_training(
        client,
        "through-a-service-cut",
        tmp_path / "again",
        60,
        max_restarts=2,
        inputs_from=[earlier],  # its outputs, fetched from the store onto each host
        init_from={"model": "across-hosts", "version": version.version},  # the same way
    )
    running_past(client, through.id, 3, timeout_s=120)
    print(on("partition", "service", env))
    time.sleep(15)
    healed = on("heal", "service", env)
    print(healed)
    assert "which stopped, were started again" in healed, healed
    said = (state / "service.log").read_text()
    assert "gangway serve stopped: the Ray head declared this service's node" in said
    done = client.wait(through.id, timeout_s=300, poll_s=0.5)  # rides out the restart
    assert done.state is JobState.SUCCEEDED and done.progress.step == 60, done.error
    text = "\n".join(line.line for line in client.logs(through.id, tail=2000))
    assert f"INPUT job-{earlier}/rank-0/result.txt trained {STEPS} steps" in text, text[-2000:]
    assert "MODEL ['.metadata', '__0_0.distcp'" in text, text[-2000:]
    assert_invariants([earlier, through.id], env, state)
    return through.id


def the_service_survives_a_cut_from_its_database(
    client: Client, hosts: Hosts, work: Path, earlier: list[int]
) -> None:
    """The service's link to PostgreSQL cut for 15 s (its lease lasts 6) while a shipped
    job runs across two hosts: the API answers 503 (`database_unavailable`), never a
    500; the loop loses its lease, the ranks go on; once the link is back the service
    takes the lease again, reattaches the gang, and the job succeeds in its first
    attempt."""
    job = submit_training(client, "through-a-database-cut", work, 80)
    _, env, state, link = hosts
    running_past(client, job.id, 3, timeout_s=120)
    link.cut()
    cut_at, url, answers = time.monotonic(), (state / "url").read_text().strip(), set()
    while time.monotonic() - cut_at < 15:
        answer = httpx.get(
            f"{url}/v1/jobs/{job.id}",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=10,
        )
        assert answer.status_code in (200, 503), answer.text
        answers.add(answer.status_code)
        time.sleep(1)
    link.restore()
    assert 503 in answers, answers  # the cut reached the service
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state is JobState.SUCCEEDED and done.attempt == 1, done.error
    assert_invariants([*earlier, job.id], env, state)


def submit_training(
    client: Client, name: str, work: Path, steps: int, *, dp: int = 2, **more: Any
) -> Job:
    """The shipped `train:main` at dp ranks of one logical GPU each, checkpointing every
    INTERVAL steps of 0.3 s."""
    return client.submit(
        name=name,
        entrypoint=Function(
            target="train:main", kwargs={"steps": steps, "interval": INTERVAL, "step_s": 0.3}
        ),
        parallelism=Parallelism(dp=dp),
        resources=Resources(gpus_per_rank=1, cpus_per_rank=0.5),
        working_dir=workdir(work),
        **more,
    )


def running_past(client: Client, job_id: int, step: int, *, timeout_s: float) -> JobInfo:
    """The job once it has reported `step` (it must not end first)."""
    deadline = time.monotonic() + timeout_s
    while (info := client.get(job_id)).progress.step < step:
        assert not info.state.is_terminal and time.monotonic() < deadline, info.status_reason
        time.sleep(0.3)
    return info


def trainer_comm_s(client: Client, name: str) -> float:
    """The median time per step in data-parallel collectives of a small built-in job with
    one rank on each of two hosts (it must succeed)."""
    job = client.submit(
        name=name,
        entrypoint=Builtin(model="gpt-tiny", steps=8, batch_size=2),
        parallelism=Parallelism(dp=2),
        resources=Resources(gpus_per_rank=2, cpus_per_rank=0.5),
    )
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state is JobState.SUCCEEDED and len({p.node_name for p in done.placement}) == 2
    times = sorted(p.comm_s for p in client.metrics(job.id) if p.comm_s is not None)
    assert times, f"{name}: no comm_s reported"
    return times[len(times) // 2]
