"""`gangway models`: register from JOB@STEP, show, alias, download, delete, as a user types them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gangway.cli
import gangway.cli_shared
from api.app import create_app
from gangway import Client
from scheduler.store import JobRepository, NewJob
from workers.checkpoint_layout import checkpoint_path, job_directory

FILES = {".metadata": b"meta", "__0_0.distcp": b"weights"}


@pytest.fixture
def cli(
    repo: JobRepository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CliRunner]:
    app = create_app(
        repo, checkpoint_root=tmp_path / "checkpoints", models_root=tmp_path / "models"
    )

    def in_process(url: str) -> Client:
        client = Client(url)
        client._http = TestClient(app, raise_server_exceptions=False)
        return client

    monkeypatch.setattr(gangway.cli_shared, "connect", in_process)
    yield CliRunner()


def run(cli: CliRunner, *args: str, code: int = 0) -> str:
    result = cli.invoke(gangway.cli.app, list(args))
    assert result.exit_code == code, result.output
    return result.output


def test_register_show_alias_download_delete(
    cli: CliRunner, repo: JobRepository, tmp_path: Path
) -> None:
    spec = {"name": "j", "entrypoint": {"kind": "builtin", "steps": 9}}
    job_id = repo.create(NewJob("j", "default", 0, spec, 1, 9)).id
    for step in (3, 6):
        folder = checkpoint_path(job_directory(tmp_path / "checkpoints", job_id), step)
        folder.mkdir(parents=True)
        for name, data in FILES.items():
            (folder / name).write_bytes(data)

    made = run(cli, "models", "register", "tiny", "--from", f"{job_id}@3")
    assert made.strip() == f"tiny v1: job {job_id} attempt 0 step 3, 2 files, 11 bytes"
    run(cli, "models", "register", "tiny", "--from", str(job_id))
    assert "no complete checkpoint at step 4" in run(
        cli, "models", "register", "tiny", "--from", f"{job_id}@4", code=1
    )
    run(cli, "models", "alias", "tiny", "2", "production")
    shown = run(cli, "models", "show", "tiny").splitlines()
    assert shown[0] == "tiny: owner default, readers none"
    assert shown[2].split()[:5] == ["1", "-", str(job_id), "0", "3"]
    assert shown[3].split()[:5] == ["2", "production", str(job_id), "0", "6"]
    assert "tiny" in run(cli, "models")
    out = tmp_path / "got"
    assert "2 files, 11 bytes, verified" in run(
        cli, "models", "download", "tiny", "production", "-o", str(out)
    )
    assert (out / "__0_0.distcp").read_bytes() == b"weights"
    run(cli, "models", "delete", "tiny", "1")
    listed = json.loads(run(cli, "models", "show", "tiny", "--json"))
    assert [v["version"] for v in listed["versions"]] == [2]
