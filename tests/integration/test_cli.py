"""The CLI against the real app and database, in process (Typer's runner; no server)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gangway.cli
import gangway.cli_shared
from api.app import create_app
from api.auth import AuthConfig
from gangway import Client
from scheduler.model import JobState, Node
from scheduler.store import JobRepository, ProgressPoint

NODES = [Node("id-1", "local-1", 4, 8.0)]


@pytest.fixture
def cli(repo: JobRepository, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    repo.replace_nodes(NODES)
    app = create_app(repo)

    def in_process(url: str) -> Client:
        client = Client(url)
        client._http = TestClient(app, raise_server_exceptions=False)  # the app, no server
        return client

    monkeypatch.setattr(gangway.cli_shared, "connect", in_process)
    yield CliRunner()


def run(cli: CliRunner, *args: str) -> str:
    result = cli.invoke(gangway.cli.app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def submit(cli: CliRunner, name: str, *extra: str) -> int:
    job = json.loads(run(cli, "submit", "--name", name, "--dp", "2", "--json", *extra))
    return int(job["id"])


def test_priority_queue_and_explain(cli: CliRunner, repo: JobRepository) -> None:
    first, second = submit(cli, "first"), submit(cli, "second")
    for job_id, position in ((first, 2), (second, 1)):
        why = {
            "blocker": "cluster_full",
            "message": "needs 2 GPUs; 0 free now",
            "unblock": "expected to start when job 9 ends",
            "queue_position": position,
        }
        repo.explain_wait(job_id, f"{why['message']}; {why['unblock']}", explanation=why)

    assert "priority 0 -> 5" not in run(cli, "priority", str(first), "5")
    assert json.loads(run(cli, "status", str(first), "--json"))["priority"] == 5

    lines = run(cli, "queue").splitlines()
    assert lines[0].split()[:4] == ["POS", "ID", "PRI", "GPUS"]
    assert [line.split()[1] for line in lines[1:]] == [str(second), str(first)]  # by position

    explained = run(cli, "explain", str(first))
    assert f"job {first}: PENDING in queue 'default', priority 5" in explained
    assert "queue position 2; estimated start unknown" in explained
    assert "unblocks when: expected to start when job 9 ends" in explained


def test_jobs_filters_and_errors(cli: CliRunner) -> None:
    submit(cli, "bert-1", "--queue", "research")
    submit(cli, "gpt-1")
    listed = run(cli, "jobs", "--queue", "research")
    assert "bert-1" in listed and "gpt-1" not in listed
    assert "gpt-1" in run(cli, "jobs", "--name-prefix", "gpt", "--state", "PENDING")
    missing = cli.invoke(gangway.cli.app, ["explain", "999"])
    assert missing.exit_code == 1 and "error:" in missing.output


def test_logs_follow_prints_until_the_job_ends(cli: CliRunner, repo: JobRepository) -> None:
    job_id = submit(cli, "talker")
    repo.append_logs(job_id, 1, [(0, 1, "step 1/2"), (0, 2, "step 2/2")])
    run(cli, "cancel", str(job_id))
    followed = run(cli, "logs", str(job_id), "-f")
    assert followed.splitlines() == ["[attempt 1 rank 0] step 1/2", "[attempt 1 rank 0] step 2/2"]
    as_json = [json.loads(x) for x in run(cli, "logs", str(job_id), "-f", "--json").splitlines()]
    assert [x["line"] for x in as_json] == ["step 1/2", "step 2/2"]


def test_metrics_prints_the_series(cli: CliRunner, repo: JobRepository) -> None:
    job_id = submit(cli, "learner")
    repo.record_progress(job_id, 1, ProgressPoint(5, loss=2.5, tokens_per_s=1234.0))
    point = ProgressPoint(6, loss=2.4, comm_s=0.012, comm_bytes=3 * 2**20)
    repo.record_progress(job_id, 1, point)
    lines = run(cli, "metrics", str(job_id)).splitlines()
    assert lines[0].split() == [
        "STEP", "ATT", "LOSS", "TOKENS/S", "STEP", "MS", "MEM", "MB", "COMM", "MS", "COMM", "MB"
    ]  # fmt: skip
    assert lines[1].split() == ["5", "1", "2.5000", "1,234", "-", "-", "-", "-"]
    assert lines[2].split() == ["6", "1", "2.4000", "-", "-", "-", "12", "3.00"]


def test_submit_sets_builtin_fields(cli: CliRunner) -> None:
    args = ["submit", "--name", "local", "--dp", "2", "--json"]
    sets = ["--set", "update_mode=local-sgd", "--set", "sync_period=16"]
    job = json.loads(run(cli, *args, *sets, "--set", "balance_batch=true"))
    entrypoint = job["spec"]["entrypoint"]
    assert (entrypoint["update_mode"], entrypoint["sync_period"]) == ("local-sgd", 16)
    assert entrypoint["balance_batch"] is True
    bad = cli.invoke(gangway.cli.app, [*args[:-1], "--set", "sync_period=0"])
    assert bad.exit_code == 2 and "sync_period" in bad.output
    unknown = cli.invoke(gangway.cli.app, [*args[:-1], "--set", "nonsense=1"])
    assert unknown.exit_code == 2 and "nonsense" in unknown.output
    refused = cli.invoke(gangway.cli.app, ["submit", "--name", "x", "--set", "balance_stages=true"])
    assert refused.exit_code == 1 and "entrypoint.balance_stages" in refused.output


def test_submit_from_a_yaml_job_file_and_show_the_cluster(cli: CliRunner, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: from-file\n"
        "priority: 3\n"
        "parallelism: {dp: 2}\n"
        "entrypoint: {kind: builtin, model: gpt-tiny, steps: 20}\n"
    )
    job = json.loads(run(cli, "submit", "--file", str(spec), "--json"))
    assert (job["name"], job["priority"], job["num_gpus"]) == ("from-file", 3, 2)
    renamed = json.loads(run(cli, "submit", "-f", str(spec), "--name", "other", "--json"))
    assert renamed["name"] == "other"

    spec.write_text("name: bad\nparallelism: {dp: 2, tp: many}\n")
    bad = cli.invoke(gangway.cli.app, ["submit", "--file", str(spec)])
    assert bad.exit_code == 1 and "parallelism.tp" in bad.output
    missing = cli.invoke(gangway.cli.app, ["submit"])
    assert missing.exit_code == 2 and "--name" in missing.output

    table = run(cli, "cluster").splitlines()
    assert table[0].split() == ["NODE", "HEALTH", "TYPE", "SPEED", "GPUS", "USED", "FREE", "JOBS"]
    assert table[1].split() == ["local-1", "alive", "-", "1", "4", "0", "4", "-"]
    typed = cli.invoke(gangway.cli.app, ["submit", "--name", "t", "--gpu-type", "V100"])
    assert typed.exit_code == 1 and "asks for V100" in typed.output
    assert "resources.gpu_types" in typed.output
    bad_type = cli.invoke(gangway.cli.app, ["submit", "--name", "t", "--gpu-type", "@H100"])
    assert bad_type.exit_code == 2 and "gpu_types.0" in bad_type.output
    assert table[-1] == "total: 4 GPUs, 0 allocated, 4 free"


def test_queues_table(cli: CliRunner) -> None:
    submit(cli, "queued", "--queue", "research")
    lines = run(cli, "queues").splitlines()
    assert lines[0].split() == [
        "QUEUE", "GUAR", "BORROW", "WEIGHT", "USED", "BORROWED", "PEND", "RUN", "FOR"
    ]  # fmt: skip
    assert lines[1].split() == ["research", "0", "any", "1", "0", "0", "1", "0", "all"]
    assert run(cli, "queues", "members", "research") == "queue research: every user (open)\n"
    refused = cli.invoke(gangway.cli.app, ["queues", "members", "research", "alice"])
    assert refused.exit_code != 0 and "members.0" in refused.output and "no user" in refused.output
    run(cli, "users", "create", "alice", "--no-key")
    assert run(cli, "queues", "members", "research", "alice") == "queue research: alice\n"
    assert run(cli, "queues").splitlines()[1].split()[-1] == "alice"
    assert run(cli, "queues", "members", "research", "--open").endswith("every user (open)\n")


def test_submit_wait_follows_the_job_to_its_end(cli: CliRunner, repo: JobRepository) -> None:
    def run_it() -> None:  # what the scheduler loop would do, once the job exists
        while not repo.in_states([JobState.PENDING]):
            time.sleep(0.05)
        [job] = repo.in_states([JobState.PENDING])
        placement = {"placement": ["id-1", "id-1"]}
        for state in (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING):
            job = repo.transition(job.id, state, reason="t", **placement)
            placement = {}
        repo.record_progress(job.id, 1, ProgressPoint(100, loss=1.0))
        repo.transition(job.id, JobState.SUCCEEDED, reason="all ranks finished at step 100")

    runner = threading.Thread(target=run_it)
    runner.start()
    output = run(cli, "submit", "--name", "waited", "--dp", "2", "--wait")
    runner.join()
    assert "SUCCEEDED  (all ranks finished at step 100)" in output
    assert "step 100/100" in output


ADMIN_KEY = "cli-tests-bootstrap-key"


@pytest.fixture
def auth_cli(repo: JobRepository, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """The app with auth on; each command sends GANGWAY_API_KEY, as `connect` does."""
    repo.replace_nodes(NODES)
    app = create_app(repo, auth=AuthConfig(required=True, admin_key=ADMIN_KEY))

    def in_process(url: str) -> Client:
        client = Client(url)
        key = os.environ.get("GANGWAY_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client._http = TestClient(app, headers=headers, raise_server_exceptions=False)
        return client

    monkeypatch.setattr(gangway.cli_shared, "connect", in_process)
    monkeypatch.setenv("GANGWAY_API_KEY", ADMIN_KEY)
    return CliRunner()


def test_users_keys_and_whoami(auth_cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(auth_cli, "whoami").strip() == "admin (admin; auth on)"
    created = run(auth_cli, "users", "create", "alice").splitlines()
    assert created[0] == "created alice (user)"
    secret = created[1].split()[3]
    assert created[1].startswith("API key 1: gw_") and "shown once" in created[1]
    users = run(auth_cli, "users", "list").splitlines()
    assert users[0].split() == ["USER", "ROLE", "SINCE"]
    assert users[1].split()[:2] == ["alice", "user"]
    monkeypatch.setenv("GANGWAY_API_KEY", secret)
    assert run(auth_cli, "whoami").strip() == "alice (user; auth on)"
    refused = auth_cli.invoke(gangway.cli.app, ["users", "list"])
    assert refused.exit_code == 1 and "403 forbidden" in refused.output
    second = run(auth_cli, "users", "key", "alice")  # rotating one's own key
    assert second.startswith("API key 2: gw_")
    run(auth_cli, "users", "revoke", "1")
    dead = auth_cli.invoke(gangway.cli.app, ["whoami"])
    assert dead.exit_code == 1 and "401 unauthorized" in dead.output
    monkeypatch.setenv("GANGWAY_API_KEY", second.split()[3])
    listed = run(auth_cli, "users", "keys", "alice").splitlines()
    assert "revoked" in listed[0] and listed[1].endswith("live")


def test_admins_set_and_delete_queues(auth_cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    row = run(
        auth_cli, "queues", "set", "research", "--guaranteed", "4", "--borrow-limit", "2",
        "--weight", "2.5",
    )  # fmt: skip
    header, line = row.splitlines()
    assert header.split()[:3] == ["QUEUE", "GUAR", "BORROW"]
    assert line.split() == ["research", "4", "2", "2.5", "0", "0", "0", "0", "all"]
    assert run(auth_cli, "queues").splitlines()[1].split()[:3] == ["research", "4", "2"]
    assert json.loads(run(auth_cli, "queues", "--json"))[0]["guaranteed_gpus"] == 4
    assert run(auth_cli, "queues", "delete", "research").strip() == "queue research: quota deleted"
    missing = auth_cli.invoke(gangway.cli.app, ["queues", "delete", "research"])
    assert missing.exit_code == 1 and "404" in missing.output
    monkeypatch.delenv("GANGWAY_API_KEY")
    anonymous = auth_cli.invoke(gangway.cli.app, ["queues"])
    assert anonymous.exit_code == 1 and "401" in anonymous.output


def test_events_and_checkpoints(
    repo: JobRepository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo.replace_nodes(NODES)
    app = create_app(repo, checkpoint_root=tmp_path)

    def in_process(url: str) -> Client:
        client = Client(url)
        client._http = TestClient(app, raise_server_exceptions=False)
        return client

    monkeypatch.setattr(gangway.cli_shared, "connect", in_process)
    cli = CliRunner()
    job_id = submit(cli, "timeline")
    run(cli, "priority", str(job_id), "3")
    run(cli, "cancel", str(job_id))
    lines = run(cli, "events", str(job_id)).splitlines()
    assert [line.split("  ", 1)[1] for line in lines] == [
        "PENDING: submitted",
        "PENDING -> PENDING: priority changed from 0 to 3",
        "PENDING -> CANCELLED: cancelled by user",
    ]
    assert run(cli, "checkpoints", str(job_id)).strip() == f"job {job_id}: no checkpoints"
    saved = tmp_path / f"job-{job_id}" / "step-00000010"
    saved.mkdir(parents=True)
    (saved / ".metadata").write_bytes(b"m" * 10)
    listed = run(cli, "checkpoints", str(job_id)).splitlines()
    assert listed[0] == f"in {tmp_path / f'job-{job_id}'}"
    assert listed[1].split() == ["STEP", "BYTES", "SAVED", "AT"]
    assert listed[2].split()[:2] == ["10", "10"]
    failed = cli.invoke(gangway.cli.app, ["events", "999"])
    assert failed.exit_code == 1 and "404" in failed.output
