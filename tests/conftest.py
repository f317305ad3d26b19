"""Shared fixtures: a migrated database per test on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import settings

from scheduler.store import JobRepository, make_engine, upgrade_to_head

# Property tests: 300 examples by default; HYPOTHESIS_PROFILE=deep for a long soak.
settings.register_profile("default", max_examples=300, deadline=None)
settings.register_profile("deep", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Services the tests start (the harness's, scripts/cluster's) queue no calibration runs of
# their own: tests count and order their jobs. The test of calibration turns it on.
os.environ.setdefault("GANGWAY_AUTO_CALIBRATE", "false")

POSTGRES_URL = os.environ.get(
    "GANGWAY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _postgres_reachable() -> str | None:
    try:
        engine = sa.create_engine(POSTGRES_URL)
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        engine.dispose()
    except Exception as exc:
        return str(exc).splitlines()[0]
    return None


@pytest.fixture(scope="session")
def postgres_available() -> None:
    problem = _postgres_reachable()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL at {POSTGRES_URL} is required in CI: {problem}")
    pytest.skip(f"PostgreSQL not reachable at {POSTGRES_URL}: {problem}")


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A URL of a fresh schema of its own, dropped afterwards."""
    schema = f"gw_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_available: None) -> Iterator[str]:
    """A fresh schema per test, so tests never see each other's rows."""
    with postgres_schema() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/gangway.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


# An end-to-end test whose database only stores what the integration tests already check
# on both: run once, on one of them (the suite's time goes to Ray and processes there).
on_sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
on_postgresql_only = pytest.mark.parametrize(
    "database_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)


@pytest.fixture
def repo(database_url: str) -> Iterator[JobRepository]:
    upgrade_to_head(database_url)
    engine = make_engine(database_url)
    yield JobRepository(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local Ray for the whole session: a head plus two nodes x 4 logical GPUs, as
    private as the service's own (loopback, token auth, its own directory)."""
    import ray

    from scheduler.runtime.local_ray import LocalClusterShape, ray_directory, start_local_cluster

    directory = ray_directory(tmp_path_factory.mktemp("data"))
    cluster: Any = start_local_cluster(LocalClusterShape(num_nodes=2, gpus_per_node=4), directory)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="session")
def gpu_node_ids(ray_cluster: Any) -> list[str]:
    from scheduler.runtime.cluster import RayClusterSource

    nodes = sorted(RayClusterSource().nodes(), key=lambda n: n.name)
    return [n.id for n in nodes if n.alive]  # a test may have removed a node it added
