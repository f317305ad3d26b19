"""The environment allow-lists (workers/supervisor/environment.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workers.supervisor.environment import program_environment, scrubbed, scrubbed_process

SERVICE_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/svc",
    "LC_ALL": "C.UTF-8",
    "NCCL_DEBUG": "INFO",
    "CUDA_VISIBLE_DEVICES": "0",
    "RAY_ADDRESS": "head:6379",
    "GANGWAY_ADMIN_KEY": "secret",
    "GANGWAY_DATABASE_URL": "postgresql://gangway:pw@db/gangway",
    "DATABASE_URL": "postgresql://x",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "RAY_AUTH_TOKEN": "token",
}


def test_rays_processes_get_the_allow_list_and_no_secret() -> None:
    assert scrubbed(SERVICE_ENV) == {
        "PATH": "/usr/bin",
        "HOME": "/home/svc",
        "LC_ALL": "C.UTF-8",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0",
        "RAY_ADDRESS": "head:6379",
    }


def test_a_program_gets_nothing_of_rays_and_cannot_override_its_rank() -> None:
    env = program_environment(
        SERVICE_ENV,
        sandbox={"PATH": "/venv/bin:/usr/bin", "HOME": "/tmp"},
        job={"HOME": "/job", "WANDB_MODE": "offline", "RANK": "7"},
        rank={"RANK": "1"},
    )
    assert env == {
        "LC_ALL": "C.UTF-8",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0",
        "PATH": "/venv/bin:/usr/bin",
        "HOME": "/job",
        "WANDB_MODE": "offline",
        "RANK": "1",
    }


def test_children_started_in_a_scrubbed_process_inherit_no_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the embedded Ray's raylets are started under."""
    monkeypatch.setenv("GANGWAY_ADMIN_KEY", "secret")
    with scrubbed_process():
        seen = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.environ))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    assert "GANGWAY_ADMIN_KEY" not in seen and "PATH" in seen
    assert os.environ["GANGWAY_ADMIN_KEY"] == "secret"  # the service keeps its own
