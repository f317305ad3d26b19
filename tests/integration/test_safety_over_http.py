"""Issue 16's safety findings through the app `gangway serve` builds from its settings
(`build_app`, its lifespan not entered: no loop, no Ray), over HTTP only. Nothing here
imports a module newer than the findings, so the same file runs against the commit they
were found on (e1c70d8), where every test fails on the finding it guards."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.server import build_app
from api.settings import Settings
from scheduler.model import Node
from tests.integration.test_auth import ADMIN_KEY, bearer, new_user

BUILTIN = {"name": "j", "entrypoint": {"kind": "builtin", "steps": 5}}
ORIGIN = "http://127.0.0.1:8000"  # where `gangway serve` listens by default


def served(database_url: str, tmp_path: Path, **settings: Any) -> TestClient:
    app = build_app(Settings(database_url=database_url, data_dir=tmp_path, **settings))
    app.state.repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    return TestClient(app, base_url=ORIGIN, raise_server_exceptions=False)


def test_a_cross_site_form_post_cannot_cancel_a_job(database_url: str, tmp_path: Path) -> None:
    """Auth off (the embedded default): a page on another site posts a form to cancel."""
    api = served(database_url, tmp_path, auth=False)
    job = api.post("/v1/jobs", json=BUILTIN).json()["id"]
    forged = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
    answer = api.post(f"/v1/jobs/{job}/cancel", headers=forged)
    assert api.get(f"/v1/jobs/{job}").json()["state"] == "PENDING"
    assert answer.status_code == 403, answer.text
    same = {"Origin": ORIGIN, "Sec-Fetch-Site": "same-origin"}
    assert api.post(f"/v1/jobs/{job}/cancel", headers=same).status_code == 200


def test_a_plain_user_cannot_run_any_file_on_the_host(database_url: str, tmp_path: Path) -> None:
    """Auth on, default policy: a stdlib module with free args is no training script."""
    api = served(database_url, tmp_path, auth=True, admin_key=ADMIN_KEY)
    alice = new_user(api, "alice")
    hostile = {"kind": "script", "path": "/usr/lib/python3.11/timeit.py", "args": ["-n1", "1"]}
    answer = api.post("/v1/jobs", json={**BUILTIN, "entrypoint": hostile}, headers=alice)
    assert answer.status_code == 403, answer.text


def test_admins_restrict_entrypoint_kinds_per_role(database_url: str, tmp_path: Path) -> None:
    api = served(
        database_url,
        tmp_path,
        auth=True,
        admin_key=ADMIN_KEY,
        allowed_entrypoints={"user": ["builtin"], "admin": ["builtin", "function"]},
    )
    bob = new_user(api, "bob")
    function = {
        **BUILTIN,
        "entrypoint": {"kind": "function", "target": "workers.examples:check_mesh"},
    }
    refused = api.post("/v1/jobs", json=function, headers=bob)
    assert refused.status_code == 403, refused.text
    assert api.post("/v1/jobs", json=BUILTIN, headers=bob).status_code == 201
    assert api.post("/v1/jobs", json=function, headers=bearer(ADMIN_KEY)).status_code == 201


def test_submit_runs_no_user_code_in_the_api_process(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    package = f"sideeffect_{uuid.uuid4().hex[:8]}"  # never imported before in this process
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "mod.py").write_text(f"open({str(marker)!r}, 'w')\ndef fn(ctx): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    api = served(database_url, tmp_path, auth=False)
    body = {**BUILTIN, "entrypoint": {"kind": "function", "target": f"{package}.mod:fn"}}
    api.post("/v1/jobs", json=body)
    assert not marker.exists(), "submit imported the user's module inside the API process"
