"""docker-compose.yml and the Dockerfile describe the production shape (no Docker engine
here, so the wiring is checked as data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_has_the_four_services() -> None:
    assert set(compose()["services"]) == {"postgres", "ray-head", "ray-worker", "gangway"}


def test_gangway_points_at_postgres_and_the_ray_head() -> None:
    services = compose()["services"]
    env = services["gangway"]["environment"]
    settings = Settings(
        database_url=env["GANGWAY_DATABASE_URL"], ray_address=env["GANGWAY_RAY_ADDRESS"]
    )
    assert settings.resolved_database_url().startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in settings.database_url
    assert settings.ray_address == "ray-head:6379"
    assert "--port=6379" in services["ray-head"]["command"]
    assert services["gangway"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert env["GANGWAY_HOST"] == "0.0.0.0"


def test_ray_workers_scale_and_join_the_head() -> None:
    worker = compose()["services"]["ray-worker"]
    assert "container_name" not in worker and "ports" not in worker  # so --scale works
    assert "--address=ray-head:6379" in worker["command"]
    assert "--num-gpus" in worker["command"]
    assert worker["deploy"]["replicas"] >= 1


def test_images_run_the_same_code() -> None:
    """One Dockerfile; the workers' image differs only in its torch build (CUDA)."""
    services = compose()["services"]
    assert {services[name]["image"] for name in ("ray-head", "gangway")} == {"gangway:latest"}
    worker_build = services["ray-worker"]["build"]
    assert worker_build["context"] == "." and services["ray-head"]["build"] == "."
    assert "/whl/cu" in worker_build["args"]["TORCH_INDEX_URL"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "torch==2.13.0" in dockerfile
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in dockerfile  # default
    for package in ("gangway", "api", "scheduler", "workers", "migrations"):
        assert f"COPY {package} ./{package}" in dockerfile


def test_the_production_shape_is_secure_by_default() -> None:
    data = compose()
    services = data["services"]
    gangway = services["gangway"]["environment"]
    # Auth on, with a bootstrap admin key that must come from the environment.
    assert gangway["GANGWAY_AUTH"] == "true"
    assert gangway["GANGWAY_ADMIN_KEY"].startswith("${GANGWAY_ADMIN_KEY:?")
    assert "ENV GANGWAY_AUTH=true" in (ROOT / "Dockerfile").read_text()
    assert "gangway:gangway@" not in gangway["GANGWAY_DATABASE_URL"]  # no fixed password
    # Ray: token auth everywhere, the dashboard (and its Jobs API) published nowhere.
    for name in ("ray-head", "ray-worker", "gangway"):
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert "ray_token" in services[name]["secrets"], name
    assert "ports" not in services["ray-head"]
    assert "--dashboard-host=127.0.0.1" in services["ray-head"]["command"]
    # PostgreSQL on an internal network the rank containers are not on.
    assert services["postgres"]["networks"] == ["db"]
    assert data["networks"]["db"]["internal"] is True
    assert "db" not in services["ray-worker"]["networks"]
    assert "ports" not in services["postgres"]
    # One shared volume for checkpoints and shipped working directories.
    for name in ("ray-worker", "gangway"):
        assert "shared:/data" in services[name]["volumes"], name
    assert gangway["GANGWAY_DATA_DIR"] == "/data"


def test_ray_containers_get_no_service_secret_and_workers_can_sandbox() -> None:
    """Only the service holds GANGWAY_ secrets; a worker can run bubblewrap (root with
    SYS_ADMIN and no seccomp profile in the way), and the image installs it."""
    services = compose()["services"]
    for name in ("ray-head", "ray-worker"):
        env = services[name]["environment"]
        assert not [key for key in env if key.startswith(("GANGWAY_ADMIN", "GANGWAY_DATABASE"))]
        assert env["RAY_AUTH_MODE"] == "token"
    worker = services["ray-worker"]
    assert worker["user"] == "root" and "SYS_ADMIN" in worker["cap_add"]
    assert "seccomp=unconfined" in worker["security_opt"]
    assert "bubblewrap" in (ROOT / "Dockerfile").read_text()
