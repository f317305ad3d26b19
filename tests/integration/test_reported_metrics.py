"""What jobs report, from the store to the REST API, the SDK, the CLI and the job page:
every point by step and attempt, any name, each once, and the objective's best value."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gangway.cli
import gangway.cli_shared
from api.app import create_app
from gangway import Client
from scheduler.model import ObjectiveSpec
from scheduler.store import JobRepository, NewJob
from scheduler.store.records import ReportedPoint
from scheduler.store.reported import MAX_NAMES
from scheduler.store.specs import spec_from_json

BUILTIN = {"name": "b", "entrypoint": {"kind": "builtin", "steps": 60}}
COMMAND = {
    "name": "c",
    "entrypoint": {"kind": "command", "argv": ["python", "train.py"]},
    "objective": {"metric": "val_acc", "mode": "max"},
}


def add_job(repo: JobRepository, spec: dict[str, object]) -> int:
    new = NewJob(
        name=str(spec["name"]), queue="default", priority=0, spec=spec, num_gpus=1, total_steps=None
    )
    return repo.create(new).id


def points(*steps: tuple[int, int, dict[str, float]]) -> list[ReportedPoint]:
    """(seq, step, values) -> points stamped one second apart."""
    return [ReportedPoint(seq, step, 1_700_000_000.0 + seq, values) for seq, step, values in steps]


def objective_of(repo: JobRepository, job_id: int) -> ObjectiveSpec | None:
    return repo.get(job_id).spec.objective


def test_every_point_is_kept_once_with_its_attempt(repo: JobRepository) -> None:
    job_id = add_job(repo, BUILTIN)
    first = points(*((s, s, {"loss": 10.0 / s}) for s in range(1, 61)))
    assert repo.append_points(job_id, 1, first, objective_of(repo, job_id)) == 60
    # A group reattached after a service restart sends what the store has again.
    again = points((59, 59, {"loss": 0.1}), (60, 60, {"loss": 0.1}), (61, 61, {"loss": 0.15}))
    assert repo.append_points(job_id, 1, again, None) == 1
    # The next attempt numbers its reports from 1 again, and resumes at step 50.
    assert repo.append_points(job_id, 2, points((1, 50, {"loss": 0.3})), None) == 1
    stored, cursor = repo.reported_points(job_id)
    assert cursor is None and len(stored) == 62
    assert [(p.attempt, p.step) for p in stored[-3:]] == [(1, 60), (1, 61), (2, 50)]
    assert stored[-2].values == {"loss": 0.15}


def test_pages_and_name_filters(repo: JobRepository) -> None:
    job_id = add_job(repo, BUILTIN)
    reports = [
        (s, s, {"loss": 1.0} | ({"val_loss": 2.0} if s % 10 == 0 else {})) for s in range(1, 26)
    ]
    repo.append_points(job_id, 1, points(*reports), None)
    page, cursor = repo.reported_points(job_id, limit=10)
    assert len(page) == 10 and cursor == page[-1].id
    rest, end = repo.reported_points(job_id, after=cursor, limit=100)
    assert len(rest) == 15 and end is None
    val, _ = repo.reported_points(job_id, names=["val_loss"])
    assert [(p.step, p.values) for p in val] == [(10, {"val_loss": 2.0}), (20, {"val_loss": 2.0})]
    assert repo.metric_names(job_id) == ["loss", "val_loss"]


def test_a_job_keeps_at_most_max_names(repo: JobRepository) -> None:
    job_id = add_job(repo, BUILTIN)
    many = {f"m{i:04d}": 1.0 for i in range(MAX_NAMES + 10)}
    repo.append_points(job_id, 1, points((1, 1, many), (2, 2, {"m9999": 1.0, "m0000": 2.0})), None)
    assert len(repo.metric_names(job_id)) == MAX_NAMES
    stored, _ = repo.reported_points(job_id)
    assert stored[1].values == {"m0000": 2.0}  # a name past the bound is dropped


@pytest.mark.parametrize(
    ("spec", "reports", "best"),
    [
        # a built-in job keeps its lowest validation loss by default
        (
            BUILTIN,
            [(1, 10, {"val_loss": 3.0}), (2, 20, {"val_loss": 2.0}), (3, 30, {"val_loss": 2.5})],
            (2.0, 20),
        ),
        # a declared objective, highest best; ties keep the earlier step
        (
            COMMAND,
            [(1, 1, {"val_acc": 0.5}), (2, 2, {"val_acc": 0.75}), (3, 3, {"val_acc": 0.75})],
            (0.75, 2),
        ),
    ],
)
def test_the_objective_keeps_its_best_value(
    repo: JobRepository,
    spec: dict[str, object],
    reports: list[tuple[int, int, dict[str, float]]],
    best: tuple[float, int],
) -> None:
    job_id = add_job(repo, spec)
    for report in reports:  # one poll each
        repo.append_points(job_id, 1, points(report), objective_of(repo, job_id))
    kept = repo.objectives([job_id])[job_id]
    assert (kept.value, kept.step, kept.attempt) == (*best, 1)


def test_a_job_without_an_objective_keeps_none(repo: JobRepository) -> None:
    spec = {"name": "f", "entrypoint": {"kind": "function", "target": "workers.examples:sleep"}}
    assert spec_from_json(spec).objective is None
    job_id = add_job(repo, spec)
    repo.append_points(job_id, 1, points((1, 1, {"val_loss": 1.0})), objective_of(repo, job_id))
    assert repo.objectives([job_id]) == {}


@pytest.fixture
def client(repo: JobRepository) -> Iterator[Client]:
    app = create_app(repo)
    sdk = Client("http://test")
    sdk._http = TestClient(app, raise_server_exceptions=False)
    yield sdk


def test_rest_and_sdk_return_every_point_and_the_best(repo: JobRepository, client: Client) -> None:
    job_id = add_job(repo, COMMAND)
    reports = [
        (s, s, {"loss": 1.0 / s} | ({"val_acc": s / 100} if s % 7 == 0 else {}))
        for s in range(1, 61)
    ]
    repo.append_points(job_id, 1, points(*reports), objective_of(repo, job_id))
    assert len(client.metric_points(job_id)) == 60  # every point, not a sample
    val = client.metric_points(job_id, ["val_acc"])
    assert [p.step for p in val] == [7, 14, 21, 28, 35, 42, 49, 56]
    page = client.metric_page(job_id, limit=25)
    assert page.names == ["loss", "val_acc"] and page.next_cursor is not None
    assert page.objective is not None and (page.objective.value, page.objective.step) == (0.56, 56)
    assert client.get(job_id).progress.objective == page.objective
    listed = client.list().items
    assert [j.progress.objective for j in listed if j.id == job_id] == [page.objective]
    bad = client._http.get(f"/v1/jobs/{job_id}/metrics", params={"name": "a b"})
    assert bad.status_code == 422 and "name" in bad.text
    assert client._http.get("/v1/jobs/999/metrics").status_code == 404


def test_the_cli_prints_reported_metrics_and_the_best(
    repo: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(repo)

    def in_process(url: str) -> Client:
        sdk = Client(url)
        sdk._http = TestClient(app, raise_server_exceptions=False)
        return sdk

    monkeypatch.setattr(gangway.cli_shared, "connect", in_process)
    job_id = add_job(repo, COMMAND)
    reports = [(1, 1, {"loss": 2.0, "lr": 3e-5}), (2, 2, {"loss": 1.5, "val_acc": 0.25})]
    repo.append_points(job_id, 1, points(*reports), objective_of(repo, job_id))
    runner = CliRunner()
    out = runner.invoke(gangway.cli.app, ["metrics", str(job_id)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split() == ["STEP", "ATT", "val_acc", "loss", "lr"]
    assert lines[1].split() == ["1", "1", "-", "2", "3e-05"]
    assert lines[2].split() == ["2", "1", "0.25", "1.5", "-"]
    assert "best val_acc (highest): 0.25 at step 2, attempt 1" in out.output
    only = runner.invoke(gangway.cli.app, ["metrics", str(job_id), "--name", "val_acc"])
    assert only.output.splitlines()[1].split() == ["2", "1", "0.25"]
    assert "also reported: loss, lr" in only.output


def test_the_job_page_charts_every_reported_metric_with_instability_marks(
    repo: JobRepository,
) -> None:
    job_id = add_job(repo, BUILTIN)
    reports = [(s, s, {"loss": 5.0 / s, "grad_norm": 1.0}) for s in range(1, 61)]
    repo.append_points(job_id, 1, points(*reports), None)
    repo.annotate(job_id, "attempt 1: instability at step 37: loss nan; rolled back to step 30")
    with TestClient(create_app(repo), raise_server_exceptions=False) as page:
        html = page.get(f"/ui/jobs/{job_id}/charts").text
    titles = re.findall(r'aria-label="([^"]+)"', html)
    assert titles == ["loss", "grad_norm"]
    lines = re.findall(r'<polyline class="line" points="([^"]+)"', html)
    assert [len(line.split()) for line in lines] == [60, 60]  # all 60 points
    assert html.count('class="mark"') == 2  # step 37, on each chart
