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
    services = compose()["services"]
    images = {services[name]["image"] for name in ("ray-head", "ray-worker", "gangway")}
    assert images == {"gangway:latest"}
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "torch==2.13.0" in dockerfile
    for package in ("gangway", "api", "scheduler", "workers", "migrations"):
        assert f"COPY {package} ./{package}" in dockerfile
