"""The production shape run as processes (`scripts/cluster up|down`): a Ray head and two
worker nodes started with `ray start` from the service's own environment (admin key and
database URL included, as a careless operator would), `gangway serve` joined to them,
PostgreSQL. A client ships a working directory with its own helper module from a temp dir;
its function runs dp=2 across both nodes (labelled H100 and A100: a gang that mixes GPU
types), is preempted by a higher-priority job that names the A100 type and resumes from its
checkpoint; no service secret reaches a rank on this external Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.service import ADMIN_KEY
from gangway import Builtin, Client, Function, JobState, Parallelism, Resources

pytestmark = pytest.mark.cluster

SCRIPT = Path(__file__).parents[2] / "scripts" / "cluster"
STEPS, INTERVAL = 40, 5


def cluster_command(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), action], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def running_in(state: Path) -> str:
    """Processes still naming the cluster's state directory (Ray's all do)."""
    pgrep = ["pgrep", "-af", f"{state}/"]
    found = subprocess.run(pgrep, capture_output=True, text=True, check=False)
    return found.stdout.strip()


def cluster_env(state: Path, postgres_url: str, **more: str) -> dict[str, str]:
    """What `scripts/cluster` is started with in these tests: its state dir, PostgreSQL,
    a quick loop, nodes of two GPUs and two CPUs; `more` on top."""
    return {
        **os.environ,
        "GANGWAY_CLUSTER_DIR": str(state),
        "GANGWAY_ADMIN_KEY": ADMIN_KEY,
        "GANGWAY_DATABASE_URL": postgres_url,
        "GANGWAY_SCHEDULE_INTERVAL_S": "0.5",
        "GANGWAY_MIN_RUNTIME_S": "0",
        "CLUSTER_GPUS_PER_NODE": "2",
        "CLUSTER_CPUS_PER_NODE": "2",
        **more,
    }


@pytest.fixture
def cluster(postgres_url: str) -> Iterator[tuple[Client, dict[str, str]]]:
    # Short: Ray's socket paths under it (session name included) must fit in 107 bytes.
    state = Path(tempfile.mkdtemp(prefix="gwc-"))
    env = cluster_env(
        state,
        postgres_url,
        GANGWAY_CHECKPOINT_GRACE_S="60",
        CLUSTER_GPU_TYPES="H100,A100",  # node-1, node-2: the gang below mixes them
    )
    try:
        up = cluster_command("up", env)
        assert up.returncode == 0, up.stdout + up.stderr
        yield Client(up.stdout.strip().splitlines()[-1], api_key=ADMIN_KEY), env
    finally:
        down = cluster_command("down", env)
        assert down.returncode == 0, down.stdout + down.stderr
        assert running_in(state) == ""
        shutil.rmtree(state, ignore_errors=True)


def workdir(root: Path) -> Path:
    (root / "helper").mkdir(parents=True)
    (root / "helper" / "__init__.py").write_text(
        "import os\n"
        "GREETING = 'hello from helper'\n"
        "def environment():\n"
        "    return ' '.join(f'{k}={v}' for k, v in sorted(os.environ.items()))\n"
    )
    (root / "data.txt").write_text("payload-from-the-workdir")
    (root / "train.py").write_text(
        "import os, pathlib, time, torch, helper\n"
        "def main(ctx, steps, interval, step_s):\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "    checkpointer = ctx.checkpointer([model], [optimizer])\n"
        "    start = saved = checkpointer.load_latest()\n"
        "    print('rank', ctx.rank, helper.GREETING, open('data.txt').read(),\n"
        "          'starts at', start, 'ENV', helper.environment(), flush=True)\n"
        "    inputs = pathlib.Path(os.environ.get('INPUTS_DIR', '/nonexistent'))\n"
        "    for read in sorted(inputs.rglob('*.txt')):\n"
        "        print('INPUT', read.relative_to(inputs), read.read_text(), flush=True)\n"
        "    if ctx.model_dir is not None:\n"
        "        print('MODEL', sorted(p.name for p in ctx.model_dir.iterdir()), flush=True)\n"
        "    for step in range(start + 1, steps + 1):\n"
        "        time.sleep(step_s)\n"
        "        stop = ctx.should_stop_together()\n"
        "        if stop or step % interval == 0 or step == steps:\n"
        "            checkpointer.save(step)\n"
        "            saved = step\n"
        "        ctx.report(step=step, loss=1.0 / step, checkpoint_step=saved)\n"
        "        if stop:\n"
        "            return\n"
        "    if ctx.rank == 0:\n"
        "        (ctx.outputs_dir / 'result.txt').write_text(f'trained {steps} steps')\n"
    )
    return root


@pytest.mark.timeout(900)
def test_a_shipped_job_spans_both_nodes_is_preempted_and_resumes_from_its_checkpoint(
    cluster: tuple[Client, dict[str, str]], tmp_path: Path
) -> None:
    client, env = cluster
    low = client.submit(
        name="low",
        entrypoint=Function(
            target="train:main", kwargs={"steps": STEPS, "interval": INTERVAL, "step_s": 0.3}
        ),
        parallelism=Parallelism(dp=2),
        # one rank per node: a gang over both GPU types, which it must allow
        resources=Resources(gpus_per_rank=2, cpus_per_rank=0.5, mix_gpu_types=True),
        working_dir=workdir(tmp_path / "work"),
    )
    deadline = time.monotonic() + 300
    while (job := client.get(low.id)).progress.step < INTERVAL + 2:
        assert not job.state.is_terminal and time.monotonic() < deadline, job.status_reason
        time.sleep(0.3)
    first_nodes = {p.rank: p.node_name for p in job.placement}
    assert len(set(first_nodes.values())) == 2, first_nodes
    types = {node.name: node.gpu_type for node in client.cluster().nodes}
    assert types == {"node-1": "H100", "node-2": "A100"}, types
    high = client.submit(
        name="high",
        priority=10,
        entrypoint=Builtin(steps=3, batch_size=2),
        resources=Resources(gpus_per_rank=2, cpus_per_rank=0.5, gpu_types=["A100"]),
    )
    finished = client.wait(high.id, timeout_s=300, poll_s=0.5)
    assert finished.state is JobState.SUCCEEDED
    assert [p.node_name for p in finished.placement] == ["node-2"]  # the type it named
    done = client.wait(low.id, timeout_s=300, poll_s=0.5)
    assert done.state is JobState.SUCCEEDED, done.error
    assert done.attempt == 2 and done.progress.step == STEPS

    preempted = next(e for e in client.events(low.id) if e.to_state is JobState.PREEMPTING)
    assert f"preempted for job {high.id}" in preempted.reason
    requeued = next(e for e in client.events(low.id) if e.from_state is JobState.PREEMPTING)
    stopped_at = int(requeued.reason.split("stopped at step ")[1].split()[0])
    lost = int(requeued.reason.split(" steps lost")[0].rsplit("(", 1)[1])
    assert 0 < stopped_at < STEPS and lost <= INTERVAL, requeued.reason

    lines = client.logs(low.id, tail=1000)
    text = "\n".join(line.line for line in lines)
    resumed_at = stopped_at - lost
    assert resumed_at > 0 and (resumed_at % INTERVAL == 0 or resumed_at == stopped_at)
    # Attempt 2 spans both nodes again and each of its ranks resumed from `resumed_at`: the
    # checkpoint was loaded on both nodes; DCP writes each replicated tensor from one rank
    # only, so some rank read, on its node, shards written on the other node.
    second_nodes = {p.rank: p.node_name for p in done.placement}
    assert len(set(second_nodes.values())) == 2, second_nodes
    print(f"attempt 1 on {first_nodes}, attempt 2 on {second_nodes}, resumed at {resumed_at}")
    for attempt, start in ((1, 0), (2, resumed_at)):
        for rank in (0, 1):
            said = [
                line.line
                for line in lines
                if (line.attempt, line.rank) == (attempt, rank) and "starts at" in line.line
            ]
            expected = f"rank {rank} hello from helper payload-from-the-workdir starts at {start} "
            assert len(said) == 1 and expected in said[0], (attempt, rank, said)
    assert ADMIN_KEY not in text
    assert env["GANGWAY_DATABASE_URL"].rsplit("@", maxsplit=1)[-1] not in text
    assert "GANGWAY_" not in text and "RAY_AUTH_TOKEN" not in text
