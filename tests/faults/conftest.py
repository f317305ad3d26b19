"""Fixtures of the fault suite: services on the session's external Ray (ranks outlive the
service) and a clean Ray before and after each case."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.faults import make_service
from bench.harness.service import Service


@pytest.fixture
def clean_ray(ray_cluster: Any) -> Iterator[None]:
    """No Gangway gang on Ray before or after a case: each case checks what it leaves."""
    from bench.harness.invariants import gangway_on_ray
    from scheduler.runtime.gangs.group import reap

    for job_id, attempt in gangway_on_ray()[0]:
        reap(job_id, attempt)
    yield
    for job_id, attempt in gangway_on_ray()[0]:
        reap(job_id, attempt)


@pytest.fixture
def service(tmp_path: Path, ray_cluster: Any, clean_ray: None) -> Iterator[Service]:
    """One service on SQLite and the shared Ray. Lease TTL 6 s: one Ray call may take 2."""
    svc = make_service(tmp_path, ray_cluster)
    try:
        yield svc
    finally:
        svc.stop()
