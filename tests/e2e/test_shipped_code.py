"""Users' own code through the whole service: `gangway serve` with its embedded Ray (whose
raylets start from the service's own environment, secrets included), auth on, PostgreSQL
(whose address must not reach the ranks); a client ships a working directory and runs a
command on two nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.service import ADMIN_KEY, Service
from gangway import Command, JobState, Parallelism, Resources
from tests.conftest import on_postgresql_only

pytestmark = pytest.mark.ray


def workdir(root: Path) -> Path:
    (root / "mylib").mkdir(parents=True)
    (root / "mylib" / "__init__.py").write_text("GREETING = 'hello from mylib'\n")
    (root / "config.txt").write_text("lr=3e-4")
    (root / "train.py").write_text(
        "import os, sys, mylib\n"
        "print(mylib.GREETING, open('config.txt').read(), 'rank', os.environ['RANK'],"
        " 'of', os.environ['WORLD_SIZE'], 'ckpt', 'CHECKPOINT_DIR' in os.environ)\n"
        "for name, value in sorted(os.environ.items()):\n"
        "    print('ENV', name, '=', value)\n"
    )
    return root


@pytest.mark.timeout(600)
@on_postgresql_only
def test_a_shipped_command_runs_on_two_nodes_and_sees_no_service_secret(
    tmp_path: Path, database_url: str
) -> None:
    (tmp_path / "service").mkdir()
    service = Service(data_dir=tmp_path / "service", database_url=database_url)
    service.env["GANGWAY_LOCAL_GPUS_PER_NODE"] = "2"
    service.env["GANGWAY_LOCAL_CPUS_PER_NODE"] = "2"
    try:
        client = service.start()
        job = client.submit(
            name="mine",
            entrypoint=Command(argv=["python", "train.py", "--lr", "3e-4"]),
            parallelism=Parallelism(dp=2),
            resources=Resources(gpus_per_rank=2, cpus_per_rank=0.5),  # a node each
            working_dir=workdir(tmp_path / "work"),
            env={"WANDB_MODE": "offline"},
        )
        done = client.wait(job.id, timeout_s=400, poll_s=0.5)
        assert done.state is JobState.SUCCEEDED, done.error
        assert len({p.node_id for p in done.placement}) == 2
        text = "\n".join(line.line for line in client.logs(job.id, tail=1000))
        for rank in (0, 1):
            assert f"hello from mylib lr=3e-4 rank {rank} of 2 ckpt True" in text
        assert "ENV WANDB_MODE = offline" in text
        assert ADMIN_KEY not in text
        assert "ENV GANGWAY_" not in text
        if database_url.startswith("postgresql"):
            assert database_url.rsplit("@", maxsplit=1)[-1] not in text
    finally:
        service.stop()
