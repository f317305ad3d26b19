"""A job's `env` is its owner's business and its `secrets` nobody's to read back. The
audit found bob reading alice's WANDB_API_KEY in GET /v1/jobs/{id}, the listings and the
job page; and there was no way to hand a job a secret that the API would not show."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gangway.cli
import gangway.cli_shared
from gangway import Builtin, Client
from gangway.errors import GangwayError, ValidationFailed
from scheduler.store.specs import spec_from_json
from tests.security.audit_api import ADMIN, BUILTIN, audited, refusal, users

ENV_VALUE = "wandb-value-alice-only"
SECRET_VALUE = "hf-secret-nobody-reads"
REDACTED = "***"


def _everything_shown(api: TestClient, job_id: int, headers: dict[str, str]) -> str:
    """The text of every read that shows the job, as `headers`' caller gets it."""
    reads = [
        f"/v1/jobs/{job_id}",
        "/v1/jobs",
        "/v1/jobs?user=alice&state=PENDING&limit=5",
        f"/v1/jobs/{job_id}/explain",
        f"/v1/jobs/{job_id}/events",
        f"/ui/jobs/{job_id}/summary",
        "/ui/jobs",
        "/ui/queue",
    ]
    texts = []
    for path in reads:
        answer = api.get(path, headers=headers)
        assert answer.status_code == 200, (path, answer.text)
        texts.append(answer.text)
    return "\n".join(texts)


def _alices_job(api: TestClient, alice: dict[str, str], **extra: object) -> dict[str, object]:
    body = {**BUILTIN, "env": {"WANDB_API_KEY": ENV_VALUE, "SEED": "1"}, **extra}
    answer = api.post("/v1/jobs", json=body, headers=alice)
    assert answer.status_code == 201, answer.text
    job: dict[str, object] = answer.json()
    return job


def test_bob_does_not_read_alices_env_values(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path)
    alice, bob = users(api)
    job = _alices_job(api, alice)
    shown = _everything_shown(api, int(str(job["id"])), bob)
    assert ENV_VALUE not in shown
    seen = api.get(f"/v1/jobs/{job['id']}", headers=bob).json()
    assert seen["spec"]["env"] == {"WANDB_API_KEY": REDACTED, "SEED": REDACTED}  # names kept
    listed = api.get("/v1/jobs", headers=bob).json()["items"]
    assert listed[0]["spec"]["env"]["WANDB_API_KEY"] == REDACTED
    # the owner and admins still read them
    assert api.get(f"/v1/jobs/{job['id']}", headers=alice).json()["spec"]["env"] == {
        "WANDB_API_KEY": ENV_VALUE,
        "SEED": "1",
    }
    assert ENV_VALUE in api.get(f"/v1/jobs/{job['id']}", headers=ADMIN).text
    assert ENV_VALUE in api.get(f"/ui/jobs/{job['id']}/summary", headers=alice).text


def test_no_one_reads_a_secret_back(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path)
    alice, bob = users(api)
    job = _alices_job(api, alice, secrets={"HF_TOKEN": SECRET_VALUE})
    assert SECRET_VALUE not in json.dumps(job)
    assert job["secret_names"] == ["HF_TOKEN"]
    job_id = int(str(job["id"]))
    for caller in (alice, bob, ADMIN):
        shown = _everything_shown(api, job_id, caller)
        assert SECRET_VALUE not in shown
        assert api.get(f"/v1/jobs/{job_id}", headers=caller).json()["secret_names"] == ["HF_TOKEN"]
    patched = api.patch(f"/v1/jobs/{job_id}", json={"priority": 3}, headers=alice)
    cancelled = api.post(f"/v1/jobs/{job_id}/cancel", headers=ADMIN)
    for answer in (patched, cancelled):
        assert answer.status_code == 200 and SECRET_VALUE not in answer.text


def test_the_secret_is_stored_for_the_ranks(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path)
    alice, _ = users(api)
    job = _alices_job(api, alice, secrets={"HF_TOKEN": SECRET_VALUE})
    stored = api.app.state.repo.get(int(str(job["id"])))  # type: ignore[attr-defined]
    assert stored.spec.code.secrets == {"HF_TOKEN": SECRET_VALUE}
    assert stored.spec.code.env["WANDB_API_KEY"] == ENV_VALUE
    assert spec_from_json(stored.spec_json).code.secrets == {"HF_TOKEN": SECRET_VALUE}
    assert SECRET_VALUE not in repr(stored)


def test_an_idempotent_replay_does_not_echo_secrets(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path)
    alice, _ = users(api)
    body = {**BUILTIN, "secrets": {"HF_TOKEN": SECRET_VALUE}}
    key = {**alice, "Idempotency-Key": "once"}
    first = api.post("/v1/jobs", json=body, headers=key)
    replay = api.post("/v1/jobs", json=body, headers=key)
    assert (first.status_code, replay.headers.get("Idempotent-Replayed")) == (201, "true")
    assert replay.json()["id"] == first.json()["id"]
    assert SECRET_VALUE not in first.text and SECRET_VALUE not in replay.text
    other = api.post("/v1/jobs", json={**body, "secrets": {"HF_TOKEN": "other"}}, headers=key)
    assert refusal(other) == (409, "Idempotency-Key")  # other secrets, another body
    estimate = api.post("/v1/estimate", json=body, headers=alice)
    assert estimate.status_code == 200 and SECRET_VALUE not in estimate.text


@pytest.mark.parametrize(
    "secrets",
    [
        {"SEED": "x"},  # also in env
        {"BAD-NAME": "x"},
        {"OK": "x" * 40_000},
    ],
)
def test_secrets_follow_envs_rules(
    database_url: str, tmp_path: Path, secrets: dict[str, str]
) -> None:
    api = audited(database_url, tmp_path)
    alice, _ = users(api)
    body = {**BUILTIN, "env": {"SEED": "1"}}
    fine = api.post("/v1/jobs", json={**body, "secrets": {"TOKEN": "x"}}, headers=alice)
    assert fine.status_code == 201, fine.text
    answer = api.post("/v1/jobs", json={**body, "secrets": secrets}, headers=alice)
    assert answer.status_code == 422, answer.text
    assert str(answer.json()["error"]["field"]).startswith("secrets")
    assert "x" * 100 not in answer.text  # a refusal does not echo the value either


def _sdk(api: TestClient, headers: dict[str, str]) -> Client:
    client = Client("http://testserver")
    client._http = TestClient(api.app, headers=headers)
    return client


def test_the_sdk_sends_secrets_and_reads_back_only_their_names(
    database_url: str, tmp_path: Path
) -> None:
    api = audited(database_url, tmp_path)
    alice, bob = users(api)
    job = _sdk(api, alice).submit(
        name="j", entrypoint=Builtin(steps=5), env={"A": "1"}, secrets={"HF_TOKEN": SECRET_VALUE}
    )
    assert job.secret_names == ["HF_TOKEN"]
    assert job.spec.secrets == {}
    assert _sdk(api, bob).get(job.id).spec.env == {"A": REDACTED}
    stored = api.app.state.repo.get(job.id)  # type: ignore[attr-defined]
    assert stored.spec.code.secrets == {"HF_TOKEN": SECRET_VALUE}


def test_the_cli_reads_a_secret_from_the_environment(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = audited(database_url, tmp_path)
    alice, _ = users(api)
    monkeypatch.setattr(gangway.cli_shared, "connect", lambda url: _sdk(api, alice))
    monkeypatch.setenv("HF_TOKEN", SECRET_VALUE)
    result = CliRunner().invoke(
        gangway.cli.app,
        ["submit", "--name", "j", "--secret", "HF_TOKEN", "--secret", "OTHER=literal", "--json"],
    )
    assert result.exit_code == 0, result.output
    assert SECRET_VALUE not in result.output
    job = json.loads(result.output)
    assert job["secret_names"] == ["HF_TOKEN", "OTHER"]
    stored = api.app.state.repo.get(job["id"])  # type: ignore[attr-defined]
    assert stored.spec.code.secrets == {"HF_TOKEN": SECRET_VALUE, "OTHER": "literal"}
    shown = CliRunner().invoke(gangway.cli.app, ["status", str(job["id"])])
    assert SECRET_VALUE not in shown.output and "HF_TOKEN" in shown.output
    missing = CliRunner().invoke(gangway.cli.app, ["submit", "--name", "j", "--secret", "NOPE_X"])
    assert missing.exit_code == 2 and "NOPE_X" in missing.output


def test_the_sdk_checks_secret_names_and_sends_the_values_once() -> None:
    """Names are checked before anything is sent; a valid secret is in the request body
    (the only place it travels)."""
    sent: list[dict[str, object]] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(500)

    client = Client("http://x", transport=httpx.MockTransport(refuse))
    with pytest.raises(ValidationFailed, match="secrets"):
        client.submit(name="j", entrypoint=Builtin(), secrets={"A=B": "1"})
    assert sent == []
    with pytest.raises(GangwayError):
        client.submit(name="j", entrypoint=Builtin(), secrets={"TOKEN": SECRET_VALUE})
    assert sent[0]["secrets"] == {"TOKEN": SECRET_VALUE}
