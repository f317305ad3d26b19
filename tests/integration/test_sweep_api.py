"""Sweeps through REST and the CLI on a real database: what a submit checks (every corner
of the space as a job, paths the base job has), what it stores, reads and cancel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError
from typer.testing import CliRunner

from scheduler.core.asha import TrialState
from scheduler.model import JobState
from scheduler.runtime.sweeps import sweep_plan
from scheduler.store import JobRepository, NewJob
from tests.integration.test_api import client as client
from tests.integration.test_cli import cli as cli
from tests.integration.test_cli import run


def sweep(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "lr-batch",
        "base": {
            "name": "tiny",
            "parallelism": {"dp": 2},
            "entrypoint": {"kind": "builtin", "model": "gpt-tiny", "steps": 81},
        },
        "space": {
            "entrypoint.learning_rate": {"kind": "log_uniform", "low": 1e-5, "high": 3e-1},
            "entrypoint.batch_size": {"kind": "choice", "values": [4, 8, 16]},
        },
        "searcher": "tpe",
        "early_stopping": {"rule": "asha"},
        "max_trials": 16,
        "max_concurrent": 4,
        "seed": 3,
    }
    body.update(overrides)
    return body


def test_a_sweep_is_stored_and_read_back(client: TestClient, repo: JobRepository) -> None:
    response = client.post("/v1/sweeps", json=sweep())
    assert response.status_code == 201, response.text
    info = response.json()
    assert (info["state"], info["searcher"], info["max_trials"]) == ("RUNNING", "tpe", 16)
    assert info["rung_steps"] == [9, 27, 81]
    assert info["objective"] == {"metric": "val_loss", "mode": "min"}
    assert info["trials"] == [] and info["best"] is None
    stored = repo.sweep(info["id"])
    assert stored.user == "default" and sweep_plan(stored.spec).budget.max_concurrent == 4
    assert client.get(f"/v1/sweeps/{info['id']}").json() == info
    assert client.get("/v1/sweeps/999999").status_code == 404


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (  # a corner the engine refuses: tp must divide gpt-tiny's heads
            {"space": {"parallelism.tp": {"kind": "choice", "values": [1, 3]}}},
            "space.parallelism.tp",
            "",
        ),
        (
            {"space": {"entrypoint.nope": {"kind": "uniform", "low": 0, "high": 1}}},
            "space.entrypoint.nope",
            "the base job has no field here",
        ),
        ({"space": {"user": {"kind": "choice", "values": ["root"]}}}, "space", ""),
        (
            {"space": {"entrypoint.kind": {"kind": "choice", "values": ["command"]}}},
            "",
            "cannot be searched",
        ),
        (
            {"space": {"entrypoint.learning_rate": {"kind": "log_uniform", "low": 0, "high": 1}}},
            "space.entrypoint.learning_rate.low",
            "",
        ),
        ({"max_concurrent": 0}, "max_concurrent", ""),
        (  # a float drawn for an integer field
            {"space": {"entrypoint.batch_size": {"kind": "uniform", "low": 4, "high": 16}}},
            "space.entrypoint.batch_size",
            "",
        ),
        (  # each end fits, both at their highest (64 GPUs) never does
            {
                "space": {
                    "parallelism.dp": {"kind": "int", "low": 1, "high": 8},
                    "parallelism.tp": {"kind": "choice", "values": [1, 8]},
                }
            },
            "space",
            "",
        ),
        (
            {
                "searcher": "grid",
                "max_trials": None,
                "space": {f"env.X{i}": {"kind": "int", "low": 0, "high": 99} for i in range(2)},
            },
            "max_trials",
            "the grid has 10,000 points",
        ),
        ({"early_stopping": {"rule": "asha", "max_steps": 50}}, "early_stopping.max_steps", ""),
        (
            {
                "base": {
                    "name": "x",
                    "entrypoint": {"kind": "builtin", "steps": 81, "update_mode": "async"},
                    "parallelism": {"dp": 2},
                }
            },
            "early_stopping",
            "no rung would have a value",
        ),
        ({"name": "n" * 191}, "name", ""),
        ({"base": {"name": "x", "entrypoint": {"kind": "builtin", "model": "gpt-huge"}}}, "", ""),
    ],
)
def test_a_bad_sweep_is_a_422_naming_the_field_and_stores_nothing(
    client: TestClient,
    repo: JobRepository,
    change: dict[str, Any],
    field: str,
    message: str,
) -> None:
    response = client.post("/v1/sweeps", json=sweep(**change))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["field"] or "").startswith(field) and message in error["message"], error
    assert repo.sweeps(limit=10) == []


def test_cancelling_a_sweep_stops_its_trials(client: TestClient, repo: JobRepository) -> None:
    info = client.post("/v1/sweeps", json=sweep()).json()
    body = {
        "name": "lr-batch-0",
        "parallelism": {"dp": 2, "tp": 1, "pp": 1},
        "resources": {"gpus_per_rank": 1, "cpus_per_rank": 1.0},
        "entrypoint": {"kind": "builtin", "model": "gpt-tiny", "steps": 81},
        "max_restarts": 0,
        "time_limit_s": None,
    }
    new = NewJob("lr-batch-0", "default", 0, body, 2, 81)
    _, job = repo.add_trial(info["id"], 0, {"entrypoint.batch_size": 8}, new, "trial 0")
    cancelled = client.post(f"/v1/sweeps/{info['id']}/cancel").json()
    assert cancelled["state"] == "CANCELLED"
    assert cancelled["trials"][0]["state"] == "stopped"
    assert cancelled["trials"][0]["job_state"] == "CANCELLED"
    assert repo.get(job.id).state is JobState.CANCELLED
    assert repo.sweep(info["id"]).trials[0].state is TrialState.STOPPED
    assert repo.add_trial(info["id"], 1, {}, new, "after the cancel") is None


def test_the_cli_starts_shows_and_cancels_a_sweep(cli: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep()))
    info = json.loads(run(cli, "sweep", "--file", str(path), "--json"))
    shown = run(cli, "sweep", "show", str(info["id"]))
    assert f"sweep {info['id']} 'lr-batch': RUNNING" in shown
    assert "tpe, 0/16 trials, objective val_loss (lowest)" in shown
    assert "rungs at steps 9, 27, 81" in shown
    assert "CANCELLED" in run(cli, "sweep", "cancel", str(info["id"]))


def test_the_status_page_shows_a_sweep_its_trials_and_charts(
    client: TestClient, repo: JobRepository
) -> None:
    info = client.post("/v1/sweeps", json=sweep()).json()
    body = {
        "name": "lr-batch-0",
        "parallelism": {"dp": 2, "tp": 1, "pp": 1},
        "resources": {"gpus_per_rank": 1, "cpus_per_rank": 1.0},
        "entrypoint": {"kind": "builtin", "model": "gpt-tiny", "steps": 81, "batch_size": 8},
        "max_restarts": 0,
        "time_limit_s": None,
    }
    params = {"entrypoint.learning_rate": 0.01, "entrypoint.batch_size": 8}
    _, job = repo.add_trial(info["id"], 0, params, NewJob("t0", "default", 0, body, 2, 81), "t")
    repo.update_trial(info["id"], 0, values={0: 3.5})
    assert f'href="/sweeps/{info["id"]}"' in client.get("/ui/sweeps").text
    assert client.get(f"/sweeps/{info['id']}").status_code == 200
    page = client.get(f"/ui/sweeps/{info['id']}").text
    assert f'href="/jobs/{job.id}"' in page and "entrypoint.learning_rate=0.01" in page
    assert page.count('<circle class="pt"') == 3  # by time, by learning rate, by batch size
    assert "val_loss by entrypoint.learning_rate" in page


def test_a_trial_number_is_made_once(client: TestClient, repo: JobRepository) -> None:
    info = client.post("/v1/sweeps", json=sweep()).json()
    body = client.post("/v1/jobs", json={"name": "x", "entrypoint": {"kind": "builtin"}})
    spec = body.json()["spec"]
    new = NewJob("x", "default", 0, spec, 1, 100)
    assert repo.add_trial(info["id"], 0, {}, new, "first") is not None
    with pytest.raises(IntegrityError):
        repo.add_trial(info["id"], 0, {}, new, "the same number twice")


def test_pause_points_are_the_sweeps_to_set(client: TestClient) -> None:
    body = {"name": "x", "entrypoint": {"kind": "builtin", "steps": 10, "pause_at": [5]}}
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "entrypoint.pause_at"
