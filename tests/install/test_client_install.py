"""`pip install gangway` is the client alone: built as a wheel, installed into a fresh venv
without extras, it holds no torch, Ray, SQLAlchemy or FastAPI, and its CLI and SDK work
against a running service."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from api.app import create_app
from api.auth import AuthConfig
from bench.harness.service import free_port
from scheduler.model import Node
from scheduler.store import JobRepository, make_engine, upgrade_to_head

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "install-test-admin-key"
SERVER_ONLY = ("torch", "ray", "sqlalchemy", "fastapi", "uvicorn", "alembic")


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout, installed with its (client) dependencies."""
    work = tmp_path_factory.mktemp("client")
    wheels = work / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = wheels.glob("gangway-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True)
    return venv


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real app over HTTP on SQLite, auth on (no scheduler loop: jobs stay PENDING)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'gangway.db'}"
    upgrade_to_head(url)
    repo = JobRepository(make_engine(url))
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    app = create_app(repo, auth=AuthConfig(required=True, admin_key=ADMIN_KEY))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield base
    server.should_exit = True
    thread.join(timeout=10)


def run(venv: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_client_install_holds_no_server_dependency(client_venv: Path) -> None:
    installed = json.loads(run(client_venv, "pip", "list", "--format=json"))
    names = {package["name"].lower() for package in installed}
    assert {"gangway", "httpx", "pydantic", "typer", "rich"} <= names
    assert not names & set(SERVER_ONLY)


def test_cli_and_sdk_work_against_a_running_service(client_venv: Path, service: str) -> None:
    assert "submit" in run(client_venv, "gangway", "--help")
    env = {"GANGWAY_URL": service, "GANGWAY_API_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"}
    script = (
        "from gangway import Builtin, Client\n"
        f"client = Client({service!r}, api_key={ADMIN_KEY!r})\n"
        "job = client.submit(name='from-a-laptop', entrypoint=Builtin(steps=5))\n"
        "print(job.id)\n"
    )
    job_id = int(run(client_venv, "python", "-c", script, env=env))
    listed = json.loads(run(client_venv, "gangway", "jobs", "--json", env=env))
    assert [job["id"] for job in listed["items"]] == [job_id]
    assert (
        httpx.get(
            f"{service}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ).json()["name"]
        == "from-a-laptop"
    )


def test_serve_without_the_server_extra_says_what_to_install(client_venv: Path) -> None:
    done = subprocess.run(
        [str(client_venv / "bin" / "gangway"), "serve"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "pip install 'gangway[server]'" in done.stderr
