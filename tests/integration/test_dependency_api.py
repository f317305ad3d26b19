"""Dependencies through REST and the CLI on a real database: what a submit may name, the
422s that name the field, and what readers see (explain, the dependencies route, the job
page and the queue)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gangway.cli
from scheduler.model import JobState
from scheduler.store import JobRepository
from tests.integration.test_api import body
from tests.integration.test_api import client as client
from tests.integration.test_cli import cli as cli
from tests.integration.test_cli import run


def submitted(client: TestClient, **fields: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=body(**fields))
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def refused(client: TestClient, **fields: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=body(**fields))
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_a_submit_names_its_upstream_jobs_and_readers_see_both_ends(
    client: TestClient,
) -> None:
    first = submitted(client, name="pretrain")
    second = submitted(client, name="finetune", depends_on=[{"job": first["id"]}])
    third = submitted(client, name="notify", depends_on=[{"job": second["id"], "on": "ended"}])
    assert second["spec"]["depends_on"] == [{"job": first["id"], "on": "succeeded"}]

    links = client.get(f"/v1/jobs/{second['id']}/dependencies").json()
    assert [(u["job"], u["name"], u["on"], u["waiting"]) for u in links["upstream"]] == [
        (first["id"], "pretrain", "succeeded", True)
    ]
    assert [(d["job"], d["on"]) for d in links["downstream"]] == [(third["id"], "ended")]
    why = client.get(f"/v1/jobs/{second['id']}/explain").json()
    assert why["upstream"][0]["job"] == first["id"]
    assert why["downstream"][0]["job"] == third["id"]
    page = client.get(f"/ui/jobs/{second['id']}/summary").text
    assert f'href="/jobs/{first["id"]}"' in page and f'href="/jobs/{third["id"]}"' in page
    assert client.get("/v1/jobs/999999/dependencies").status_code == 404
    # reading a job's outputs waits for its success, as starting from its checkpoint does
    reader = submitted(client, name="report", inputs_from=[first["id"]])
    assert reader["spec"]["inputs_from"] == [first["id"]]
    upstream = client.get(f"/v1/jobs/{reader['id']}/dependencies").json()["upstream"]
    assert [(u["job"], u["on"]) for u in upstream] == [(first["id"], "succeeded")]


def test_bad_dependencies_are_422s_naming_the_field_and_store_nothing(
    client: TestClient, repo: JobRepository
) -> None:
    first = submitted(client)
    before = len(repo.page(limit=100))
    cases = [
        ({"depends_on": [{"job": 999_999}]}, "depends_on.0.job", "no job 999999"),
        ({"depends_on": [{"job": "pretrain"}]}, "depends_on.0.job", "names a pipeline step"),
        (
            {"depends_on": [{"job": first["id"]}, {"job": first["id"], "on": "ended"}]},
            "depends_on",
            "named more than once",
        ),
        ({"depends_on": [{"job": first["id"], "on": "soon"}]}, "depends_on.0.on", ""),
        ({"depends_on": [{"job": 0}]}, "depends_on.0.job", ""),
        ({"init_from": {"job": 999_999}}, "init_from.job", "no job 999999"),
        ({"inputs_from": [first["id"], 999_999]}, "inputs_from.1", "no job 999999"),
        ({"inputs_from": ["pretrain"]}, "inputs_from.0", "names a pipeline step"),
        (
            {"depends_on": [{"job": first["id"], "on": "started"}], "inputs_from": [first["id"]]},
            "inputs_from.0",
            "read once it succeeded",
        ),
    ]
    for fields, field, message in cases:
        error = refused(client, **fields)
        assert error["field"].startswith(field), (fields, error)
        assert message in error["message"], (fields, error)
    assert len(repo.page(limit=100)) == before


def test_a_condition_that_can_no_longer_hold_is_refused_at_submit(
    client: TestClient, repo: JobRepository
) -> None:
    failed = submitted(client)
    repo.transition(failed["id"], JobState.CANCELLED, reason="cancelled by user")
    error = refused(client, depends_on=[{"job": failed["id"]}])
    assert error["field"] == "depends_on.0.job"
    assert "already ended CANCELLED" in error["message"]
    # An end of any kind still satisfies `ended`, and a failure `failed`.
    assert submitted(client, depends_on=[{"job": failed["id"], "on": "ended"}])
    assert submitted(client, depends_on=[{"job": failed["id"], "on": "failed"}])


def test_a_retry_gets_the_first_job_even_once_its_condition_cannot_hold(
    client: TestClient, repo: JobRepository
) -> None:
    """A client that lost the answer retries with the same key: it must find the job it
    made, not a 422 about a failure that happened since (the job was cancelled for it)."""
    upstream = submitted(client)
    sent = body(depends_on=[{"job": upstream["id"]}])
    key = {"Idempotency-Key": "retry-1"}
    first = client.post("/v1/jobs", json=sent, headers=key)
    assert first.status_code == 201, first.text
    repo.transition(upstream["id"], JobState.CANCELLED, reason="cancelled by user")
    again = client.post("/v1/jobs", json=sent, headers=key)
    assert again.status_code == 201, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    other = client.post("/v1/jobs", json=body(name="another"), headers=key)
    assert other.status_code == 409  # the key with another body is still refused


def test_the_cli_submits_after_a_job_and_explains_the_wait(
    cli: CliRunner, client: TestClient
) -> None:
    first = submitted(client)
    after = json.loads(
        run(cli, "submit", "--name", "after", "--after", f"{first['id']}:ended", "--json")
    )
    assert after["spec"]["depends_on"] == [{"job": first["id"], "on": "ended"}]
    explained = run(cli, "explain", str(after["id"]))
    assert f"waits for: job {first['id']} 'demo' (PENDING) on ended: waiting" in explained
    bad = cli.invoke(gangway.cli.app, ["submit", "--name", "x", "--after", "soon"])
    assert bad.exit_code == 2 and "give JOB[:CONDITION]" in bad.output
