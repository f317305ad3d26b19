"""Run-time predictions in the service: the loop predicts and stores, the API, CLI and
page show them, `POST /v1/estimate` answers before a submit (no Ray: fake executor)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gangway.cli
import gangway.cli_shared
from api.app import create_app
from gangway import AsyncClient, Client
from gangway.models import Builtin, Estimate, JobSubmit, Parallelism
from scheduler.model import RESOURCE_HOLDING_STATES, JobState, Node
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.loop import SchedulerLoop
from scheduler.runtime.predictions import REPREDICT_RUNNING_S, Predictions
from scheduler.runtime.working_set import WorkingSet
from scheduler.store import JobRecord, JobRepository, NewJob
from tests.integration.test_loop import NODES, Clock, FakeCluster, FakeExecutor


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def executor() -> FakeExecutor:
    return FakeExecutor()


@pytest.fixture
def repo(repo: JobRepository, clock: Clock) -> JobRepository:
    repo = repo.with_clock(clock)
    repo.replace_nodes(NODES)
    return repo


@pytest.fixture
def loop(repo: JobRepository, executor: FakeExecutor, clock: Clock) -> SchedulerLoop:
    return SchedulerLoop(repo=repo, cluster=FakeCluster(), executor=executor, clock=clock)


@pytest.fixture
def api(repo: JobRepository) -> TestClient:
    return TestClient(create_app(repo), raise_server_exceptions=False)


def submit(
    repo: JobRepository,
    name: str,
    *,
    dp: int = 1,
    user: str = "ann",
    queue: str = "default",
    entrypoint: dict[str, Any] | None = None,
) -> JobRecord:
    spec = {
        "name": name,
        "queue": queue,
        "user": user,
        "parallelism": {"dp": dp},
        "entrypoint": entrypoint or {"kind": "function", "target": "pkg.mod:fn"},
    }
    steps = (entrypoint or {}).get("steps")
    return repo.create(
        NewJob(
            name=name, queue=queue, user=user, priority=0, spec=spec, num_gpus=dp, total_steps=steps
        )
    )


def run_to_end(
    loop: SchedulerLoop,
    executor: FakeExecutor,
    clock: Clock,
    job: JobRecord,
    seconds: float,
    *,
    step_time_s: float | None = None,
) -> None:
    """Admit, start, run `seconds` (reporting a step time if given), succeed."""
    loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True)
    loop.tick()
    clock.now += timedelta(seconds=seconds)
    if step_time_s is not None:
        executor.statuses[job.id] = GroupStatus(
            GroupPhase.RUNNING, True, step=5, step_time_s=step_time_s
        )
        loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=10)
    loop.tick()


def test_history_predicts_similar_jobs_and_says_unknown_for_the_rest(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock, api: TestClient
) -> None:
    for seconds in (90, 100, 110):
        run_to_end(loop, executor, clock, submit(repo, "etl"), seconds)
    similar = submit(repo, "etl")
    stranger = submit(repo, "etl", user="bob", queue="other")
    loop.tick()
    started = repo.get(similar.id).started_at or repo.get(similar.id).admitted_at
    assert started is not None

    info = api.get(f"/v1/jobs/{similar.id}").json()
    assert info["prediction"]["source"] == "history"
    assert info["prediction"]["runtime_s"] == 100.0
    assert (info["prediction"]["low_s"], info["prediction"]["high_s"]) == (90.0, 110.0)
    assert "same user, name" in info["prediction"]["basis"]
    assert info["estimated_end_at"] is not None

    unknown = api.get(f"/v1/jobs/{stranger.id}").json()["prediction"]
    assert (unknown["source"], unknown["runtime_s"]) == ("unknown", None)

    # The prediction made while it waited (100 s) against the 125 s it then ran.
    executor.statuses[similar.id] = GroupStatus(GroupPhase.RUNNING, True)
    loop.tick()
    clock.now += timedelta(seconds=125)
    executor.statuses[similar.id] = GroupStatus(GroupPhase.SUCCEEDED, True)
    loop.tick()
    accuracy = api.get("/v1/predictions/accuracy").json()
    assert accuracy["predicted"] == 1
    assert accuracy["median_ape"] == pytest.approx(25 / 125)
    assert (
        "Run-time predictions were off by 20% (median) on 1 finished" in api.get("/ui/queue").text
    )


def running_at_step_4(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock, steps: int
) -> JobRecord:
    """A built-in trainer that started, reported step 4 at 10 s a step 40 s later, and
    was predicted from it."""
    job = submit(repo, "train", entrypoint={"kind": "builtin", "steps": steps})
    loop.tick()
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True)
    loop.tick()
    clock.now += timedelta(seconds=40)
    executor.statuses[job.id] = GroupStatus(GroupPhase.RUNNING, True, step=4, step_time_s=10.0)
    loop.tick()  # ingests the progress
    loop.tick()  # predicts from it
    return job


def test_a_running_trainer_is_predicted_from_its_measured_steps(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock, api: TestClient
) -> None:
    job = running_at_step_4(repo, loop, executor, clock, steps=10)
    info = api.get(f"/v1/jobs/{job.id}").json()
    assert info["prediction"]["source"] == "steps"
    assert info["prediction"]["remaining_s"] == pytest.approx(60.0)  # 6 steps x 10 s
    assert info["prediction"]["step_time_s"] == pytest.approx(10.0)
    end = clock.now + timedelta(seconds=60)
    assert info["estimated_end_at"] == end.isoformat().replace("+00:00", "Z")
    page = api.get(f"/ui/jobs/{job.id}/summary").text
    assert "Expected end" in page and "steps" in page


def test_a_pass_that_changed_nothing_predicts_nothing_until_a_running_job_is_due(
    repo: JobRepository,
    loop: SchedulerLoop,
    executor: FakeExecutor,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = running_at_step_4(repo, loop, executor, clock, steps=100)
    predicted: list[int] = []
    predict = Predictions.predict_record
    monkeypatch.setattr(
        Predictions,
        "predict_record",
        lambda self, job, *args: (predicted.append(job.id), predict(self, job, *args))[1],
    )
    clock.now += timedelta(seconds=REPREDICT_RUNNING_S - 1)
    loop.tick()
    assert predicted == []  # same rows, same history: the last pass's predictions
    clock.now += timedelta(seconds=2)
    loop.tick()
    assert predicted == [job.id]  # due: its end moves with the clock


def test_predictions_are_written_only_when_they_change(
    repo: JobRepository, loop: SchedulerLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    record = repo.record_predictions
    monkeypatch.setattr(
        repo,
        "record_predictions",
        lambda changed, pending: (writes.append(len(changed)), record(changed, pending)),
    )
    submit(repo, "blocked", dp=8)
    submit(repo, "also", dp=8)
    loop.tick()
    loop.tick()
    loop.tick()
    assert writes == [2]


def calibrated(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock
) -> None:
    """Three recorded runs of the built-in trainer at dp 1, 2 and 4."""
    for dp, step_s in ((1, 0.4), (2, 0.25), (4, 0.2)):
        job = submit(repo, f"cal{dp}", dp=dp, entrypoint={"kind": "builtin", "steps": 10})
        run_to_end(loop, executor, clock, job, 30, step_time_s=step_s)


def test_the_step_time_model_predicts_trainers_once_calibrated_and_plans_auto(
    repo: JobRepository, loop: SchedulerLoop, executor: FakeExecutor, clock: Clock, api: TestClient
) -> None:
    trainer = {"kind": "builtin", "model": "gpt-tiny", "steps": 100, "batch_size": 8}
    before = api.post(
        "/v1/estimate", json={"name": "t", "parallelism": "auto", "entrypoint": trainer}
    )
    assert before.status_code == 200, before.text  # a fresh service plans at assumed speeds
    fresh = before.json()
    assert fresh["prediction"]["source"] == "model"
    assert (
        "assumed speeds for 4 GPU / 8 CPU (not measured: error unknown; `gangway calibrate`"
        in (fresh["prediction"]["basis"])
    )
    assert fresh["prediction"]["low_s"] is None  # its error is not known
    assert "by the assumed speeds" in fresh["plan_reason"]

    calibrated(repo, loop, executor, clock)
    answer = api.post(
        "/v1/estimate",
        json={"name": "t", "parallelism": "auto", "gpu_budget": 4, "entrypoint": trainer},
    )
    assert answer.status_code == 200, answer.text
    estimate = answer.json()
    assert estimate["prediction"]["source"] == "model"
    assert "recorded runs, expected error" in estimate["prediction"]["basis"]
    low, high = estimate["prediction"]["low_s"], estimate["prediction"]["high_s"]
    assert low < estimate["prediction"]["runtime_s"] < high
    assert estimate["step_time_s"] > 0
    assert estimate["plan_reason"].startswith(f"dp={estimate['parallelism']['dp']}")
    assert estimate["estimated_start_at"] == clock.now.isoformat().replace("+00:00", "Z")

    created = api.post(
        "/v1/jobs",
        json={"name": "t", "parallelism": "auto", "gpu_budget": 4, "entrypoint": trainer},
    )
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["spec"]["parallelism"] == estimate["parallelism"]
    [first] = api.get(f"/v1/jobs/{job['id']}/events").json()
    assert first["reason"].startswith("submitted; parallelism auto chose dp=")
    loop.tick()
    assert api.get(f"/v1/jobs/{job['id']}").json()["prediction"]["source"] in {"model", "steps"}


def test_estimate_reads_the_earliest_start_from_the_core(
    repo: JobRepository, loop: SchedulerLoop, api: TestClient
) -> None:
    opaque = {
        "name": "x",
        "parallelism": {"dp": 4},
        "entrypoint": {"kind": "function", "target": "workers.examples:allreduce_ranks"},
    }
    free = api.post("/v1/estimate", json=opaque).json()
    assert free["wait_reason"] is None
    assert free["prediction"]["source"] == "unknown"

    submit(repo, "hog", dp=8)
    loop.tick()
    busy = api.post("/v1/estimate", json=opaque).json()
    assert busy["wait_reason"].startswith("needs 4 GPUs")
    assert busy["estimated_start_at"] > free["estimated_start_at"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {
                "parallelism": "auto",
                "entrypoint": {"kind": "function", "target": "workers.examples:allreduce_ranks"},
            },
            "parallelism",
        ),
        ({"parallelism": "fast", "entrypoint": {"kind": "builtin"}}, "parallelism"),
        ({"gpu_budget": 0, "entrypoint": {"kind": "builtin"}}, "gpu_budget"),
        ({"parallelism": {"dp": 64}, "entrypoint": {"kind": "builtin"}}, "parallelism"),
    ],
)
def test_bad_estimates_are_422_naming_the_field(
    api: TestClient, body: dict[str, Any], field: str
) -> None:
    answer = api.post("/v1/estimate", json={"name": "x", **body})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"].startswith(field)


def test_cli_estimate_and_accuracy(
    repo: JobRepository, api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def in_process(url: str) -> Client:
        client = Client(url)
        client._http = TestClient(api.app, raise_server_exceptions=False)
        return client

    monkeypatch.setattr(gangway.cli_shared, "connect", in_process)
    runner = CliRunner()
    shown = runner.invoke(gangway.cli.app, ["estimate", "--name", "x", "--dp", "2"])
    assert shown.exit_code == 0, shown.output
    assert "plan: dp=2 tp=1 pp=1" in shown.output
    assert "(model: assumed speeds for" in shown.output
    assert "earliest start:" in shown.output
    answer = runner.invoke(gangway.cli.app, ["accuracy", "--json"])
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.output)["predicted"] == 0
    planned = runner.invoke(gangway.cli.app, ["estimate", "--name", "x", "--auto"])
    assert planned.exit_code == 0, planned.output
    assert "by the assumed speeds for" in planned.output


def test_the_sdk_estimates_sync_and_async(api: TestClient) -> None:
    client = Client("http://testserver")
    client._http = TestClient(api.app, raise_server_exceptions=False)
    job = {"name": "x", "parallelism": Parallelism(dp=2), "entrypoint": Builtin(steps=5)}
    answer = client.estimate(**job)
    assert answer.parallelism.dp == 2
    assert answer.prediction.source == "model"  # a trainer, at assumed speeds
    assert client.prediction_accuracy().predicted == 0

    async def ask() -> Estimate:
        transport = httpx.ASGITransport(app=api.app)
        async with AsyncClient("http://testserver", transport=transport) as aclient:
            return await aclient.estimate(JobSubmit(**job))

    assert asyncio.run(ask()).estimated_start_at == answer.estimated_start_at


def test_a_fresh_service_measures_its_node_type_once_with_calibration_runs(
    repo: JobRepository, executor: FakeExecutor, clock: Clock, api: TestClient
) -> None:
    """The loop queues the runs itself on its first pass (one pipeline of short,
    lowest-priority built-in jobs, one after another), never twice, not again after a
    restart; until they are measured a trainer's prediction at assumed speeds is shown
    but not handed to the core; once three have succeeded the estimates use the model
    fitted to them, and the runs are nobody's history."""

    def auto_loop() -> SchedulerLoop:
        return SchedulerLoop(
            repo=repo, cluster=FakeCluster(), executor=executor, clock=clock, auto_calibrate=True
        )

    loop = auto_loop()
    loop.tick()
    runs = repo.page(user="gangway")
    assert sorted(job.name for job in runs) == [
        "calibrate 4 GPU / 8 CPU: gpt-mini b4 dp=1",
        "calibrate 4 GPU / 8 CPU: gpt-mini b4 dp=2",
        "calibrate 4 GPU / 8 CPU: gpt-mini b4 tp=2",
        "calibrate 4 GPU / 8 CPU: gpt-tiny b8 dp=1",
    ]
    assert {job.priority for job in runs} == {-1_000_000}
    assert repo.pipeline(runs[0].pipeline_id).name == "calibrate 4 GPU / 8 CPU"
    loop.tick()
    auto_loop().tick()  # a restart finds them
    assert len(repo.page(user="gangway")) == 4
    mine = submit(repo, "mine", entrypoint={"kind": "builtin", "steps": 50})
    loop.tick()
    shown = api.get(f"/v1/jobs/{mine.id}").json()["prediction"]
    assert shown["source"] == "model" and "assumed speeds" in shown["basis"]
    working = WorkingSet(repo, (JobState.PENDING, *RESOURCE_HOLDING_STATES))
    views = Predictions(repo).views(working.load(), working, repo.nodes(), clock.now)
    assert {v.id: v.predicted_remaining_s for v in views}[mine.id] is None  # not the core's
    api.post(f"/v1/jobs/{mine.id}/cancel")
    assert api.post("/v1/calibrations").status_code == 409  # beside the running ones: no

    ordered = sorted(runs, key=lambda j: j.id)
    for index, step_s in enumerate((0.05, 0.4, 0.3)):
        job = ordered[index]
        loop.tick()  # the run before it ended: this one is released and admitted
        later = [repo.get(j.id).state for j in ordered[index + 1 :]]
        assert later == [JobState.PENDING] * len(later)  # one at a time: they would interfere
        executor.statuses[job.id] = GroupStatus(
            GroupPhase.RUNNING, True, step=5, step_time_s=step_s
        )
        loop.tick()
        executor.statuses[job.id] = GroupStatus(GroupPhase.SUCCEEDED, True, step=12)
        loop.tick()
    trainer = {"kind": "builtin", "model": "gpt-mini", "steps": 500, "batch_size": 4}
    answer = api.post(
        "/v1/estimate", json={"name": "t", "parallelism": {"dp": 2}, "entrypoint": trainer}
    )
    basis = answer.json()["prediction"]["basis"]
    assert "step-time model for 4 GPU / 8 CPU (3 recorded runs, expected error" in basis
    stranger = {"kind": "function", "target": "workers.examples:allreduce_ranks"}
    unknown = api.post("/v1/estimate", json={"name": "etl", "entrypoint": stranger}).json()
    assert unknown["prediction"]["source"] == "unknown"  # calibration runs are no history


def test_admins_queue_calibration_runs_again(repo: JobRepository, api: TestClient) -> None:
    made = api.post("/v1/calibrations")
    assert made.status_code == 201, made.text
    assert [job["user"] for job in made.json()] == ["gangway"] * 4
    repo.replace_nodes([])
    assert api.post("/v1/calibrations").status_code == 409  # no live node to measure


def test_each_gpu_type_is_calibrated_in_turn_on_its_own_type(
    repo: JobRepository, executor: FakeExecutor, clock: Clock
) -> None:
    """On a cluster of two GPU types the most common type's runs come first, each pinned
    to that type (placement would send them to the fastest); the other type's after."""
    typed = [
        Node("a1", "a100-1", 4, 8.0, gpu_type="A100"),
        Node("a2", "a100-2", 4, 8.0, gpu_type="A100"),
        Node("h1", "h100-1", 4, 8.0, gpu_type="H100"),
    ]
    loop = SchedulerLoop(
        repo=repo, cluster=FakeCluster(typed), executor=executor, clock=clock, auto_calibrate=True
    )
    loop.tick()
    first = repo.page(user="gangway")
    assert {job.name.split(":")[0] for job in first} == {"calibrate 4 A100 / 8 CPU"}
    assert {job.spec.shape.gpu_types for job in first} == {frozenset({"A100"})}
    for job in first:  # the next type's runs wait until these ended
        repo.transition(job.id, JobState.CANCELLED, reason="test: done with this type")
    loop.tick()
    names = {job.name.split(":")[0] for job in repo.page(user="gangway")}
    assert names == {"calibrate 4 A100 / 8 CPU", "calibrate 4 H100 / 8 CPU"}
