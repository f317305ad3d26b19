"""Pipelines through REST, the SDK's calls and the CLI on a real database: all steps or
none, step names resolved to job ids, each refusal naming the step's field, cancel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gangway.cli
from api.pipelines import pipeline_state
from scheduler.model import CheckpointInit, JobState
from scheduler.store import JobRepository
from tests.integration.test_api import client as client
from tests.integration.test_cli import cli as cli
from tests.integration.test_cli import run

BUILTIN = {"kind": "builtin", "model": "gpt-tiny", "steps": 5}


def pipeline(**overrides: Any) -> dict[str, Any]:
    """pretrain -> finetune (from pretrain's checkpoint) -> evaluate (after finetune)."""
    body: dict[str, Any] = {
        "name": "pretrain-finetune-evaluate",
        "jobs": [
            {"name": "pretrain", "entrypoint": BUILTIN},
            {"name": "finetune", "entrypoint": BUILTIN, "init_from": {"job": "pretrain"}},
            {
                "name": "evaluate",
                "entrypoint": BUILTIN,
                "depends_on": [{"job": "finetune", "on": "ended"}],
                "inputs_from": ["pretrain"],
            },
        ],
    }
    body.update(overrides)
    return body


def test_a_pipeline_stores_every_step_with_the_names_made_ids(
    client: TestClient, repo: JobRepository
) -> None:
    response = client.post("/v1/pipelines", json=pipeline())
    assert response.status_code == 201, response.text
    info = response.json()
    assert info["state"] == "PENDING"
    pretrain, finetune, evaluate = (job["id"] for job in info["jobs"])
    assert [job["pipeline_id"] for job in info["jobs"]] == [info["id"]] * 3
    assert info["jobs"][1]["spec"]["init_from"] == {"job": pretrain, "step": None}
    assert info["jobs"][2]["spec"]["depends_on"] == [{"job": finetune, "on": "ended"}]
    assert info["jobs"][2]["spec"]["inputs_from"] == [pretrain]
    assert repo.get(evaluate).spec.inputs_from == (pretrain,)
    assert repo.get(finetune).spec.init_from == CheckpointInit(pretrain)
    assert [(u.job_id, u.condition.value) for u in repo.links(finetune).upstream] == [
        (pretrain, "succeeded")  # init_from waits for its success
    ]
    assert sorted((u.job_id, u.condition.value) for u in repo.links(evaluate).upstream) == [
        (pretrain, "succeeded"),  # inputs_from waits for its success too
        (finetune, "ended"),
    ]
    events = repo.events(pretrain)
    assert events[0].reason == f"submitted as step 'pretrain' of pipeline {info['id']} " + (
        "(pretrain-finetune-evaluate)"
    )
    assert client.get(f"/v1/pipelines/{info['id']}").json()["jobs"] == info["jobs"]
    assert client.get("/v1/pipelines/999999").status_code == 404


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (  # names a later step
            {0: {"depends_on": [{"job": "evaluate"}]}},
            "jobs.0.depends_on.0.job",
            "'evaluate' is not an earlier step of the pipeline",
        ),
        (
            {2: {"init_from": {"job": "nope"}}},
            "jobs.2.init_from.job",
            "'nope' is not an earlier step",
        ),
        ({2: {"depends_on": [{"job": 999_999}]}}, "jobs.2.depends_on.0.job", "no job 999999"),
        ({1: {"inputs_from": ["evaluate"]}}, "jobs.1.inputs_from.0", "not an earlier step"),
        ({1: {"name": "pretrain"}}, "jobs", "step name 'pretrain' used more than once"),
        ({2: {"parallelism": {"dp": 0}}}, "jobs.2.parallelism", ""),
        ({2: {"entrypoint": {"kind": "builtin", "model": "gpt-huge"}}}, "jobs.2.entrypoint", ""),
    ],
)
def test_one_bad_step_refuses_the_pipeline_naming_it_and_stores_nothing(
    client: TestClient,
    repo: JobRepository,
    change: dict[int, dict[str, Any]],
    field: str,
    message: str,
) -> None:
    body = pipeline()
    for index, fields in change.items():
        body["jobs"][index] = {**body["jobs"][index], **fields}
    response = client.post("/v1/pipelines", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"].startswith(field) and message in error["message"], error
    assert repo.page(limit=10) == []


def test_cancelling_a_pipeline_cancels_what_has_not_ended(
    client: TestClient, repo: JobRepository
) -> None:
    info = client.post("/v1/pipelines", json=pipeline()).json()
    first = info["jobs"][0]["id"]
    for state in (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
        repo.transition(first, state, reason="test")
    cancelled = client.post(f"/v1/pipelines/{info['id']}/cancel").json()
    assert [job["state"] for job in cancelled["jobs"]] == ["SUCCEEDED", "CANCELLED", "CANCELLED"]
    assert cancelled["state"] == "CANCELLED"
    assert "cancelled with pipeline" in cancelled["jobs"][1]["status_reason"]


def test_the_state_of_a_pipeline_adds_up_its_steps() -> None:
    S = JobState
    assert pipeline_state([S.SUCCEEDED, S.RUNNING, S.PENDING]) is S.RUNNING
    assert pipeline_state([S.SUCCEEDED, S.PENDING]) is S.PENDING
    assert pipeline_state([S.SUCCEEDED, S.SUCCEEDED]) is S.SUCCEEDED
    assert pipeline_state([S.FAILED, S.CANCELLED]) is S.FAILED
    assert pipeline_state([S.SUCCEEDED, S.CANCELLED]) is S.CANCELLED


def test_the_cli_submits_a_pipeline_file_shows_and_cancels_it(
    cli: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline()))
    info = json.loads(run(cli, "submit", "--file", str(path), "--json"))
    assert [job["name"] for job in info["jobs"]] == ["pretrain", "finetune", "evaluate"]
    shown = run(cli, "pipeline", "status", str(info["id"]))
    assert f"pipeline {info['id']} 'pretrain-finetune-evaluate': PENDING (3 steps)" in shown
    assert "finetune" in shown
    assert "CANCELLED" in run(cli, "pipeline", "cancel", str(info["id"]))
    path.write_text(yaml.safe_dump(pipeline(jobs=[])))
    bad = cli.invoke(gangway.cli.app, ["submit", "--file", str(path)])
    assert bad.exit_code == 1 and "jobs" in bad.output


def test_a_pipeline_file_may_say_on_unquoted(cli: CliRunner, tmp_path: Path) -> None:
    """YAML 1.1 reads a bare `on` as true; the CLI reads YAML 1.2's booleans only."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        "name: two\n"
        "jobs:\n"
        "  - {name: first, entrypoint: {kind: builtin, steps: 5}}\n"
        "  - name: second\n"
        "    depends_on: [{job: first, on: ended}]\n"
        "    entrypoint: {kind: builtin, steps: 5}\n"
    )
    info = json.loads(run(cli, "submit", "--file", str(path), "--json"))
    first = info["jobs"][0]["id"]
    assert info["jobs"][1]["spec"]["depends_on"] == [{"job": first, "on": "ended"}]
