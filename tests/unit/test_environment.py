"""The rank environment allow-list (workers/supervisor/environment.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workers.supervisor.environment import rank_environment, scrubbed, scrubbed_process

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


def test_only_allow_listed_names_pass_and_the_job_env_wins() -> None:
    assert scrubbed(SERVICE_ENV) == {
        "PATH": "/usr/bin",
        "HOME": "/home/svc",
        "LC_ALL": "C.UTF-8",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0",
        "RAY_ADDRESS": "head:6379",
    }
    env = rank_environment(SERVICE_ENV, {"HOME": "/job", "WANDB_MODE": "offline"})
    assert env["HOME"] == "/job" and env["WANDB_MODE"] == "offline"
    assert not any(name.startswith("GANGWAY_") for name in env)


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
