"""The service cut off from its database (PostgreSQL behind a link the case cuts) while a
gang runs, for longer than the leader's lease: the loop's passes fail and it loses the
lease, the ranks go on on Ray; once the link is back the service takes the lease again,
reattaches the gang and the job finishes, with the fault suite's invariants."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from bench.harness.faults import EVERY, make_service, submit_counter, wait_state
from bench.harness.invariants import check, finished
from bench.harness.link import CuttableLink
from bench.harness.service import ADMIN_KEY, Service
from gangway import JobState

pytestmark = [pytest.mark.ray, pytest.mark.postgres, pytest.mark.timeout(600)]

CUT_S = 15.0  # well past the lease's 6 s


@pytest.fixture
def link(postgres_url: str) -> Iterator[tuple[CuttableLink, str]]:
    url = make_url(postgres_url)
    cut = CuttableLink((url.host or "127.0.0.1", url.port or 5432))
    try:
        yield cut, url.set(host="127.0.0.1", port=cut.port).render_as_string(hide_password=False)
    finally:
        cut.close()


@pytest.mark.faults
def test_a_database_partition_longer_than_the_lease_loses_no_gang(
    tmp_path: Path, ray_cluster: Any, clean_ray: None, link: tuple[CuttableLink, str]
) -> None:
    cut, database_url = link
    service: Service = make_service(tmp_path, ray_cluster, database_url)
    try:
        client = service.start()
        job = submit_counter(client, steps=60, step_s=0.1)
        wait_state(client, job.id, "stepping")
        cut.cut()
        started = time.monotonic()
        while time.monotonic() - started < CUT_S:  # the API says it, never a bare 500
            answer = httpx.get(
                f"{service.url}/v1/jobs/{job.id}",
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                timeout=10,
            )
            assert answer.status_code in (200, 503), answer.text
            time.sleep(1)
        cut.restore()
        (done,) = finished(client, [job.id])
        assert done.state is JobState.SUCCEEDED, done.status_reason
        check(client, [job.id], checkpoints=tmp_path / "checkpoints", every=EVERY)
    finally:
        service.stop()
