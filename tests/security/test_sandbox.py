"""A plain user's job attacks the service, Ray and another user's job, on the embedded
default (its own local Ray, SQLite in its data directory) with auth on, and on
`scripts/cluster` (external Ray nodes, PostgreSQL). One attack job per deployment
(`sandbox_attack.py`, `attacker/attack.py`) records every probe; each test below checks one
property of what it got. Every one of them failed on 7e32613, where ranks ran inside
Gangway's own Ray workers as the service's user."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.service import ADMIN_KEY, Service
from gangway import Client
from scheduler.runtime.local_ray import ray_directory
from tests.conftest import postgres_schema
from tests.e2e.test_cluster import cluster_command, running_in
from tests.security.sandbox_attack import Outcome, Target, attack

Attacked = tuple[Outcome, Target]


def embedded(scratch: Path) -> Iterator[Attacked]:
    data = scratch / "service"
    data.mkdir()
    service = Service(data_dir=data, database_url=f"sqlite:///{data}/gangway.db")
    try:
        admin = service.start()
        ray_dir = ray_directory(data)
        address = (ray_dir / "ray" / "ray_current_cluster").read_text().strip()
        target = Target(data, ray_dir, address, (ADMIN_KEY,))
        yield attack(admin, service.url, target, scratch), target
    finally:
        service.stop()


def cluster(scratch: Path, database_url: str) -> Iterator[Attacked]:
    state = Path(tempfile.mkdtemp(prefix="gws-"))  # short: Ray's socket paths
    env = {
        **os.environ,
        "GANGWAY_CLUSTER_DIR": str(state),
        "GANGWAY_ADMIN_KEY": ADMIN_KEY,
        "GANGWAY_DATABASE_URL": database_url,
        "GANGWAY_SCHEDULE_INTERVAL_S": "0.5",
    }
    try:
        up = cluster_command("up", env)
        assert up.returncode == 0, up.stdout + up.stderr
        url = up.stdout.strip().splitlines()[-1]
        admin = Client(url, api_key=ADMIN_KEY)
        password_host = database_url.rsplit("@", maxsplit=1)[-1]
        target = Target(
            state / "service",
            state,
            (state / "address").read_text().strip(),
            (ADMIN_KEY, password_host, (state / "ray_token").read_text().strip()),
        )
        yield attack(admin, url, target, scratch), target
    finally:
        down = cluster_command("down", env)
        assert down.returncode == 0, down.stdout + down.stderr
        assert running_in(state) == ""
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("embedded", marks=pytest.mark.ray),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ],
)
def attacked(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Attacked]:
    scratch = tmp_path_factory.mktemp("attack")
    if request.param == "embedded":
        yield from embedded(scratch)
        return
    request.getfixturevalue("postgres_available")
    with postgres_schema() as database_url:
        yield from cluster(scratch, database_url)


def test_a_job_reads_no_secret_from_another_process(attacked: Attacked) -> None:
    """/proc/<pid>/environ and cmdline of the service, Ray and alice's job."""
    report = attacked[0].report
    assert report["leaks_in_proc"] == []
    assert report["visible_processes"] <= 6  # its own: the sandbox's init, sh, python...


def test_a_job_has_nothing_of_rays_or_the_services_in_its_environment(attacked: Attacked) -> None:
    report = attacked[0].report
    assert report["ray_variables"] == []
    assert not [name for name in report["environment"] if name.startswith("GANGWAY_")]


def test_a_job_cannot_open_the_database_or_become_admin(attacked: Attacked) -> None:
    outcome = attacked[0]
    assert outcome.report["database"] != "written"
    assert outcome.attacker.whoami().role == "user"


def test_a_job_reads_no_key_and_no_file_of_another_job(attacked: Attacked) -> None:
    """The database, Ray's token (the service's and the default path), alice's checkpoint
    and outputs, the host's shadow file."""
    reads = attacked[0].report["reads"]
    assert [path for path, result in reads.items() if result == "read"] == []


def test_a_job_writes_only_its_own_directories(attacked: Attacked) -> None:
    outcome, target = attacked
    writes = outcome.report["writes"]
    ours = {"/tmp/mine.txt", "/gangway/outputs/mine.txt"}
    assert {path for path, result in writes.items() if result == "written"} == ours
    assert not [p for p in writes if p.startswith(str(target.data_dir)) and Path(p).exists()]


def test_a_job_reaches_no_ray_api(attacked: Attacked) -> None:
    """As a driver with the GCS address, and the Jobs API on every listening port."""
    report = attacked[0].report
    assert report["ray"] not in ("connected", "killed"), report["ray"]
    accepted = {
        port: answer for port, answer in report["ray_jobs_api"].items() if " 200 " in answer
    }
    assert accepted == {}


def test_a_job_stops_no_other_job(attacked: Attacked) -> None:
    outcome = attacked[0]
    assert outcome.report["signalled"] <= 4  # only its own sandbox's processes
    assert outcome.alice_state_after.value == "RUNNING" and outcome.alice_attempt_after == 1


def test_a_job_runs_as_an_unprivileged_uid_that_cannot_become_root(attacked: Attacked) -> None:
    report = attacked[0].report
    assert report["uid"] == 65534 and report["setuid_root"] != "became root"


def test_what_a_job_wrote_to_its_outputs_is_its_owners_to_download(
    attacked: Attacked, tmp_path: Path
) -> None:
    outcome = attacked[0]
    files = {f.path for f in outcome.attacker.outputs(outcome.attack_job)}
    assert {"report.json", "mine.txt"} <= files
    written = outcome.attacker.download(outcome.attack_job, "report.json", tmp_path)
    assert written[0].read_text().startswith("{")


def test_a_builtin_job_runs_no_shipped_code(attacked: Attacked) -> None:
    outcome = attacked[0]
    assert outcome.builtin_state.value == "SUCCEEDED"
    assert "SITECUSTOMIZE-RAN" not in outcome.builtin_logs


def test_output_that_is_not_text_or_never_ends_reaches_the_logs_cut(attacked: Attacked) -> None:
    outcome = attacked[0]
    lines = [line.line for line in outcome.attacker.logs(outcome.attack_job, tail=100)]
    assert "\ufffd\ufffd not utf-8" in lines
    assert max(len(line) for line in lines) == 4000
    assert "after the endless line" in lines
