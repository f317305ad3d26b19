"""The slower fault cases: the embedded service killed with SIGKILL (its Ray must go with
it), the leader killed with a standby waiting out the TTL, and a node's raylet killed."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from bench.harness.faults import EVERY, make_service, submit_counter, wait_state
from bench.harness.invariants import check, finished, ledger_violations
from bench.harness.service import Service
from gangway import JobState
from scheduler.runtime.cluster import NODE_NAME_LABEL
from scheduler.runtime.ray_watchdog import session_processes

pytestmark = [pytest.mark.faults_slow, pytest.mark.timeout(900)]


def ray_session_of(pid: int) -> str:
    """The session directory of the Ray whose GCS process `pid` started."""
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and cmdline[0].endswith("gcs_server"):
            for arg in cmdline:
                if arg.startswith("--session-dir="):
                    return arg.split("=", 1)[1]
    raise AssertionError(f"no Ray GCS started by pid {pid}")


def alive(pids: set[int]) -> set[int]:
    """Those still running (a zombie has exited; only its parent's reaping is left)."""
    running = set()
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            running.add(pid)
    return running


def test_kill9_of_the_embedded_service_takes_its_ray_along(tmp_path: Path) -> None:
    """`gangway serve` with its own Ray, killed with SIGKILL while a job runs: every
    process of that Ray session is gone within seconds (the watchdog), and the restarted
    service requeues the job, which finishes from its checkpoint."""
    service = Service(data_dir=tmp_path)
    try:
        client = service.start()
        job = submit_counter(client, steps=30)
        wait_state(client, job.id, "stepping")
        assert service.process is not None
        session = ray_session_of(service.process.pid)
        pids = set(session_processes(session))
        assert len(pids) >= 4, pids  # GCS, raylets, agents, rank workers
        service.stop(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"embedded Ray after kill -9: {len(pids)} processes, {len(alive(pids))} left")
        assert not alive(pids), [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in alive(pids)]
        client = service.start()
        done = finished(client, [job.id])[0]
        assert done.state is JobState.SUCCEEDED and done.attempt == 2, done.status_reason
        lost, problems = ledger_violations(
            tmp_path / "checkpoints" / f"job-{job.id}" / "ledger", EVERY
        )
        print(f"steps lost at most {lost} (checkpoint interval {EVERY})")
        assert not problems and lost <= EVERY
    finally:
        service.stop()


@pytest.mark.ray
@pytest.mark.postgres
def test_kill9_of_the_leader_with_a_standby_waiting_out_the_ttl(
    tmp_path: Path, postgres_url: str, ray_cluster: Any, clean_ray: None
) -> None:
    services = []
    for name in ("leader", "standby"):
        (tmp_path / name).mkdir()
        services.append(make_service(tmp_path / name, ray_cluster, database_url=postgres_url))
    leader, standby = services
    standby.env["GANGWAY_DATA_DIR"] = leader.env["GANGWAY_DATA_DIR"]  # shared checkpoints
    try:
        leader.start()
        client = standby.start()
        job = submit_counter(client, steps=50)
        wait_state(client, job.id, "stepping")
        leader.stop(signal.SIGKILL)
        killed_at = time.monotonic()
        done = finished(client, [job.id])[0]
        assert done.state is JobState.SUCCEEDED and done.attempt == 1, done.status_reason
        assert "lease taken" in standby.log_tail(50_000)
        print(f"standby finished the job {time.monotonic() - killed_at:.1f} s after the kill")
        check(client, [job.id], checkpoints=tmp_path / "leader" / "checkpoints", every=EVERY)
    finally:
        standby.stop()
        leader.stop()


@pytest.mark.ray
def test_a_killed_raylet_fails_the_gang_and_strands_nothing(
    tmp_path: Path, ray_cluster: Any, clean_ray: None
) -> None:
    """A job spread over three nodes loses one (its raylet killed): the gang fails, the
    ranks on the live nodes are torn down, and the job is requeued (it no longer fits:
    it waits), with no GPU held on Ray for it."""
    node = ray_cluster.add_node(num_gpus=2, num_cpus=4, labels={NODE_NAME_LABEL: "local-3"})
    ray_cluster.wait_for_nodes()
    service = make_service(tmp_path, ray_cluster)
    try:
        client = service.start()
        job = submit_counter(client, dp=10, steps=400, max_restarts=1)
        wait_state(client, job.id, "stepping", timeout_s=240)
        ray_cluster.remove_node(node, allow_graceful=False)
        waiting = wait_state(client, job.id, "PENDING", timeout_s=120)
        assert waiting.restarts == 1, waiting.status_reason
        check(client, [job.id], checkpoints=tmp_path / "checkpoints", every=EVERY)
        client.cancel(job.id)
    finally:
        service.stop()
        if node in ray_cluster.worker_nodes:
            ray_cluster.remove_node(node, allow_graceful=False)
