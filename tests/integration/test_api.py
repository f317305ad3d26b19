"""REST v1 through the real app and a real database (no Ray: the API never calls it)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx_sse import EventSource
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from api.openapi import COMMITTED, document, render
from api.server import build_app
from api.settings import Settings
from scheduler.model import JobState, Node, QueueQuota
from scheduler.store import JobRepository, ProgressPoint, QueueRepository
from scheduler.store.remote_models import RemoteModelFiles
from workers.checkpoint_store import CheckpointStore, JobCheckpointStore

NODES = [Node("id-1", "local-1", 4, 8.0), Node("id-2", "local-2", 4, 8.0)]


@pytest.fixture
def client(repo: JobRepository) -> Iterator[TestClient]:
    repo.replace_nodes(NODES)
    with TestClient(create_app(repo), raise_server_exceptions=False) as client:
        yield client


def body(**overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "name": "demo",
        "parallelism": {"dp": 2},
        "entrypoint": {"kind": "builtin", "model": "gpt-tiny", "steps": 5},
    }
    job.update(overrides)
    return job


def test_submit_returns_201_with_the_pending_job(client: TestClient) -> None:
    response = client.post("/v1/jobs", json=body(priority=3))
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["state"] == "PENDING"
    assert job["priority"] == 3
    assert job["queue"] == "default"
    assert job["num_gpus"] == 2
    assert job["spec"]["parallelism"] == {"dp": 2, "tp": 1, "pp": 1, "fsdp": False}
    assert job["spec"]["resources"] == {
        "gpus_per_rank": 1,
        "cpus_per_rank": 1.0,
        "gpu_types": None,
        "mix_gpu_types": False,
    }
    assert job["progress"]["total_steps"] == 5
    assert client.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]


def test_submit_and_cancel_wake_the_scheduler_but_a_rejected_job_does_not(
    repo: JobRepository,
) -> None:
    repo.replace_nodes(NODES)
    woken: list[int] = []
    app = create_app(repo, on_change=lambda: woken.append(1))
    with TestClient(app, raise_server_exceptions=False) as client:
        job = client.post("/v1/jobs", json=body()).json()
        assert client.post("/v1/jobs", json=body(parallelism={"dp": 0})).status_code == 422
        assert len(woken) == 1
        client.post(f"/v1/jobs/{job['id']}/cancel")
        assert len(woken) == 2


def test_submit_function_entrypoint(client: TestClient) -> None:
    entrypoint = {
        "kind": "function",
        "target": "workers.examples:allreduce_ranks",
        "kwargs": {"steps": 2},
    }
    response = client.post(
        "/v1/jobs", json=body(entrypoint=entrypoint, parallelism={"dp": 2, "tp": 2})
    )
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"parallelism": {"dp": 0}}, "parallelism.dp"),
        ({"parallelism": {"dp": {"min": 3, "max": 2}}}, "parallelism.dp"),
        ({"parallelism": {"dp": {"min": 0, "max": 2}}}, "parallelism.dp.min"),
        ({"parallelism": {"dp": {"min": 9, "max": 12}}}, "parallelism"),
        ({"parallelism": {"dp": 1, "tp": -1}}, "parallelism.tp"),
        ({"parallelism": {"dp": 1, "zz": 2}}, "parallelism.zz"),
        ({"name": ""}, "name"),
        ({"queue": "has space"}, "queue"),
        ({"entrypoint": {"kind": "builtin", "steps": 0}}, "entrypoint.steps"),
        ({"entrypoint": {"kind": "shell"}}, "entrypoint"),
        ({"entrypoint": {"kind": "builtin", "model": "gpt-huge"}}, "entrypoint.model"),
        (
            {"entrypoint": {"kind": "function", "target": "no_such_module_x:fn"}},
            "entrypoint.target",
        ),
        (
            {"entrypoint": {"kind": "function", "target": "workers.examples:nope"}},
            "entrypoint.target",
        ),
        ({"entrypoint": {"kind": "function", "target": "missing-colon"}}, "entrypoint.target"),
        ({"parallelism": {"dp": 9}}, "parallelism"),
        (
            {
                "parallelism": {"tp": 8},
                "entrypoint": {"kind": "function", "target": "workers.examples:allreduce_ranks"},
            },
            "parallelism",
        ),
        ({"parallelism": {"tp": 4}}, "parallelism.tp"),  # gpt-tiny has 2 heads
        ({"parallelism": {"dp": 1, "pp": 8}}, "parallelism.pp"),  # and 4 layers
        ({"entrypoint": {"kind": "builtin", "microbatches": 3}}, "entrypoint.microbatches"),
        (
            {
                "parallelism": {"dp": 2, "fsdp": True},
                "entrypoint": {"kind": "builtin", "grad_compression": "fp16"},
            },
            "entrypoint.grad_compression",
        ),
        ({"entrypoint": {"kind": "builtin", "precision": "fp8"}}, "entrypoint.precision"),
        (
            {
                "parallelism": {"pp": 2},
                "entrypoint": {"update_mode": "local-sgd", "microbatches": 2},
            },
            "entrypoint.update_mode",
        ),
        ({"parallelism": {"pp": 2}}, "entrypoint.microbatches"),  # 1F1B: one per stage
        ({"entrypoint": {"update_mode": "bogus"}}, "entrypoint.update_mode"),
        (
            {"parallelism": {"tp": 2}, "entrypoint": {"update_mode": "async"}},
            "entrypoint.update_mode",
        ),
        ({"entrypoint": {"max_staleness": -1}}, "entrypoint.max_staleness"),
        (
            {"entrypoint": {"update_mode": "async", "balance_batch": True}},
            "entrypoint.balance_batch",
        ),
        ({"entrypoint": {"sync_period": 0}}, "entrypoint.sync_period"),
        ({"entrypoint": {"balance_stages": True}}, "entrypoint.balance_stages"),
        (
            {"parallelism": {"tp": 2}, "entrypoint": {"balance_batch": True}},
            "entrypoint.balance_batch",
        ),
        ({"entrypoint": {"kind": "script", "path": "a\u0000b"}}, "entrypoint.path"),
        (
            {"entrypoint": {"kind": "script", "path": "x.py", "args": ["\u0000"]}},
            "entrypoint.args.0",
        ),
        ({"checkpoint": {"keep_last": 0}}, "checkpoint.keep_last"),
        ({"resources": {"gpus_per_rank": 0}}, "resources.gpus_per_rank"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"time_limit_s": 0}, "time_limit_s"),
    ],
)
def test_bad_input_is_422_naming_the_field_and_stores_nothing(
    client: TestClient, repo: JobRepository, overrides: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/jobs", json=body(**overrides))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert error["field"] == field, error
    assert error["message"]
    assert repo.page() == []


def test_malformed_json_is_422_not_500(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_error"


def test_never_fits_message_explains(client: TestClient) -> None:
    message = client.post("/v1/jobs", json=body(parallelism={"dp": 9})).json()["error"]["message"]
    assert "needs 9 GPUs; the cluster has 8" in message


def test_list_filters_and_paginates_newest_first(client: TestClient) -> None:
    ids = [client.post("/v1/jobs", json=body(name=f"j{i}")).json()["id"] for i in range(3)]
    client.post(f"/v1/jobs/{ids[0]}/cancel")
    page = client.get("/v1/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in page["items"]] == [ids[2], ids[1]]
    rest = client.get("/v1/jobs", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [j["id"] for j in rest["items"]] == [ids[0]]
    assert rest["next_cursor"] is None
    cancelled = client.get("/v1/jobs", params={"state": "CANCELLED"}).json()
    assert [j["id"] for j in cancelled["items"]] == [ids[0]]
    assert client.get("/v1/jobs", params={"state": "NOPE"}).json()["error"]["field"] == "state.0"
    assert client.get("/v1/jobs", params={"limit": 0}).status_code == 422


def test_cancel_and_events(client: TestClient) -> None:
    job_id = client.post("/v1/jobs", json=body()).json()["id"]
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "CANCELLED"
    assert cancelled.json()["finished_at"] is not None
    again = client.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "conflict"
    events = client.get(f"/v1/jobs/{job_id}/events").json()
    assert [(e["from_state"], e["to_state"]) for e in events] == [
        (None, "PENDING"),
        ("PENDING", "CANCELLED"),
    ]


def test_logs_tail_and_filter_by_rank(client: TestClient, repo: JobRepository) -> None:
    job_id = client.post("/v1/jobs", json=body()).json()["id"]
    repo.append_logs(job_id, 1, [(0, 1, "step 1"), (1, 1, "hello from 1"), (0, 2, "step 2")])
    lines = client.get(f"/v1/jobs/{job_id}/logs").json()["lines"]
    assert [(x["rank"], x["line"]) for x in lines] == [
        (0, "step 1"),
        (1, "hello from 1"),
        (0, "step 2"),
    ]
    one = client.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1, "tail": 5}).json()
    assert one["lines"] == [
        {"attempt": 1, "rank": 1, "seq": 1, "line": "hello from 1", "id": lines[1]["id"]}
    ]
    bad = client.get(f"/v1/jobs/{job_id}/logs", params={"tail": 0})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "tail"


def test_unknown_job_is_404_everywhere(client: TestClient) -> None:
    for method, path in [
        ("GET", "/v1/jobs/424242"),
        ("POST", "/v1/jobs/424242/cancel"),
        ("GET", "/v1/jobs/424242/events"),
        ("GET", "/v1/jobs/424242/logs"),
        ("GET", "/v1/jobs/424242/logs/stream"),
        ("GET", "/v1/jobs/424242/explain"),
        ("PATCH", "/v1/jobs/424242"),
    ]:
        payload = {"priority": 1} if method == "PATCH" else None
        response = client.request(method, path, json=payload)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert client.get("/v1/nowhere").json()["error"]["code"] == "not_found"


def test_cluster_shows_allocation_from_placements(client: TestClient, repo: JobRepository) -> None:
    job_id = client.post("/v1/jobs", json=body(parallelism={"dp": 3})).json()["id"]
    repo.transition(job_id, JobState.ADMITTED, reason="test", placement=["id-1", "id-1", "id-2"])
    cluster = client.get("/v1/cluster").json()
    assert (cluster["gpus_total"], cluster["gpus_allocated"], cluster["gpus_free"]) == (8, 3, 5)
    by_name = {n["name"]: n for n in cluster["nodes"]}
    assert by_name["local-1"]["gpus_allocated"] == 2
    assert by_name["local-2"]["jobs"] == [job_id]
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert [(p["rank"], p["node_name"]) for p in job["placement"]] == [
        (0, "local-1"),
        (1, "local-1"),
        (2, "local-2"),
    ]
    assert by_name["local-1"]["gpu_holders"] == [job_id, job_id, None, None]
    assert by_name["local-2"]["gpu_holders"] == [job_id, None, None, None]


def test_placement_shows_each_ranks_mesh_coordinates_and_gpus_their_holders(
    client: TestClient, repo: JobRepository
) -> None:
    """dp=2 x tp=2 x pp=2 on two GPUs per rank: 16 GPUs, so two nodes of 8."""
    repo.replace_nodes([Node("id-1", "big-1", 8, 8.0), Node("id-2", "big-2", 8, 8.0)])
    spec = body(
        parallelism={"dp": 2, "tp": 2, "pp": 2},
        resources={"gpus_per_rank": 2},
        entrypoint={"kind": "builtin", "model": "gpt-tiny", "steps": 5, "microbatches": 2},
    )
    job_id = client.post("/v1/jobs", json=spec).json()["id"]
    placement = ["id-1"] * 4 + ["id-2"] * 4
    repo.transition(job_id, JobState.ADMITTED, reason="test", placement=placement)
    ranks = client.get(f"/v1/jobs/{job_id}").json()["placement"]
    coordinates = [(p["pp_rank"], p["dp_rank"], p["tp_rank"]) for p in ranks]
    assert coordinates == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
        (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1),
    ]  # fmt: skip
    nodes = client.get("/v1/cluster").json()["nodes"]
    assert [n["gpu_holders"] for n in nodes] == [[job_id] * 8, [job_id] * 8]


def test_a_waiting_jobs_explanation_and_estimate_reach_the_api_and_the_page(
    client: TestClient, repo: JobRepository
) -> None:
    job_id = client.post("/v1/jobs", json=body(name="visible-on-page")).json()["id"]
    eta = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    explanation = {"blocker": "cluster_full", "message": "needs 2 GPUs; 0 free now", "unblock": "u"}
    repo.explain_wait(
        job_id, "needs 2 GPUs; 0 free now; u", explanation=explanation, estimated_start_at=eta
    )
    queue = client.get("/ui/queue").text
    assert "visible-on-page" in queue and "needs 2 GPUs; 0 free now" in queue
    assert 'title="2030-01-02T03:04:05+00:00"' in queue
    assert "local-1" in client.get("/ui/cluster").text
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["explanation"]["blocker"] == "cluster_full"
    assert job["estimated_start_at"].startswith("2030-01-02T03:04:05")


def test_healthz_and_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    schema = client.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/cluster"} <= set(
        schema["paths"]
    )
    assert client.get("/docs").status_code == 200


def test_elastic_job_asks_for_its_maximum_and_must_fit_only_its_minimum(
    client: TestClient,
) -> None:
    response = client.post("/v1/jobs", json=body(parallelism={"dp": {"min": 2, "max": 16}}))
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["spec"]["parallelism"]["dp"] == {"min": 2, "max": 16}
    assert job["num_gpus"] == 16


def test_jobs_are_filtered_by_queue_user_and_name_prefix(client: TestClient) -> None:
    for name, queue, user in [
        ("bert-a", "research", "ana"),
        ("bert-b", "prod", "ana"),
        ("gpt-c", "research", "bo"),
        ("bert_x", "research", "bo"),  # `_` is a literal, not a LIKE wildcard
    ]:
        client.post("/v1/jobs", json=body(name=name, queue=queue, user=user))

    def names(**params: str) -> list[str]:
        return [j["name"] for j in client.get("/v1/jobs", params=params).json()["items"]]

    assert names(queue="research") == ["bert_x", "gpt-c", "bert-a"]
    assert names(user="ana") == ["bert-b", "bert-a"]
    assert names(name_prefix="bert-") == ["bert-b", "bert-a"]
    assert names(queue="research", user="bo", name_prefix="gpt") == ["gpt-c"]
    assert names(queue="nobody") == []


def test_priority_changes_with_an_event_and_not_after_the_end(client: TestClient) -> None:
    job_id = client.post("/v1/jobs", json=body()).json()["id"]
    changed = client.patch(f"/v1/jobs/{job_id}", json={"priority": 7})
    assert changed.status_code == 200, changed.text
    assert changed.json()["priority"] == 7
    last = client.get(f"/v1/jobs/{job_id}/events").json()[-1]
    assert (last["from_state"], last["to_state"]) == ("PENDING", "PENDING")
    assert last["reason"] == "priority changed from 0 to 7"

    bad = client.patch(f"/v1/jobs/{job_id}", json={"priority": "high"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "priority"
    unknown = client.patch(f"/v1/jobs/{job_id}", json={"priority": 1, "queue": "prod"})
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "queue"
    assert client.patch("/v1/jobs/999", json={"priority": 1}).status_code == 404
    client.post(f"/v1/jobs/{job_id}/cancel")
    ended = client.patch(f"/v1/jobs/{job_id}", json={"priority": 9})
    assert ended.status_code == 409 and "already ended" in ended.json()["error"]["message"]


def test_explain_says_why_a_job_waits_and_when_it_should_start(
    client: TestClient, repo: JobRepository
) -> None:
    job_id = client.post("/v1/jobs", json=body()).json()["id"]
    eta = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    explanation = {
        "blocker": "cluster_full",
        "message": "needs 2 GPUs; 0 free now",
        "unblock": "expected to start when job 4 ends",
        "blocking_job_id": 4,
        "queue_position": 3,
    }
    repo.explain_wait(job_id, "needs 2 GPUs; ...", explanation=explanation, estimated_start_at=eta)
    explained = client.get(f"/v1/jobs/{job_id}/explain").json()
    assert explained["state"] == "PENDING"
    assert explained["blocker"] == "cluster_full" and explained["blocking_job_id"] == 4
    assert explained["queue_position"] == 3
    assert explained["unblock"] == "expected to start when job 4 ends"
    assert explained["estimated_start_at"].startswith("2030-01-02T03:04:05")
    assert explained["queued_s"] >= 0 and explained["attained_gpu_hours"] == 0
    assert client.get("/v1/jobs/999/explain").status_code == 404

    client.post(f"/v1/jobs/{job_id}/cancel")
    ended = client.get(f"/v1/jobs/{job_id}/explain").json()
    assert (ended["state"], ended["reason"], ended["queued_s"]) == (
        "CANCELLED",
        "cancelled by user",
        None,
    )


def test_metrics_are_prometheus_text_from_the_store_and_the_loop(client: TestClient) -> None:
    client.post("/v1/jobs", json=body(queue="research"))
    client.post("/v1/jobs", json=body(queue="research"))
    cancelled = client.post("/v1/jobs", json=body(queue="prod")).json()["id"]
    client.post(f"/v1/jobs/{cancelled}/cancel")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    assert samples[("gangway_jobs", (("queue", "research"), ("state", "PENDING")))] == 2
    assert samples[("gangway_jobs", (("queue", "prod"), ("state", "CANCELLED")))] == 1
    assert samples[("gangway_queue_depth", (("queue", "research"),))] == 2
    assert samples[("gangway_gpus_total", ())] == 8
    assert samples[("gangway_gpus_allocated", ())] == 0
    assert ("gangway_scheduling_pass_seconds_count", ()) in samples  # the loop's, same text
    assert "/metrics" not in client.get("/openapi.json").json()["paths"]


def test_an_idempotency_key_makes_a_retried_submit_return_the_same_job(
    client: TestClient,
) -> None:
    headers = {"Idempotency-Key": "run-42"}
    first = client.post("/v1/jobs", json=body(), headers=headers)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    # the same job spelled with its defaults: still a retry
    again = client.post("/v1/jobs", json=body(priority=0, queue="default"), headers=headers)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert len(client.get("/v1/jobs").json()["items"]) == 1

    reused = client.post("/v1/jobs", json=body(name="other"), headers=headers)
    assert reused.status_code == 409
    error = reused.json()["error"]
    assert (error["code"], error["field"]) == ("idempotency_key_reused", "Idempotency-Key")
    assert f"job {first.json()['id']}" in error["message"]

    assert client.post("/v1/jobs", json=body()).json()["id"] != first.json()["id"]  # no key
    empty = client.post("/v1/jobs", json=body(), headers={"Idempotency-Key": ""})
    assert empty.status_code == 422 and empty.json()["error"]["field"] == "Idempotency-Key"


def test_the_committed_openapi_document_is_the_apps() -> None:
    committed = COMMITTED.read_text()
    assert render(document()) == committed, "the API changed: run `python -m api.openapi`"


def sse_events(response: Any) -> list[tuple[str, str, str]]:
    """(event, id, data) per Server-Sent Event of a read response, decoded by httpx-sse."""
    return [(e.event, e.id, e.data) for e in EventSource(response).iter_sse()]


def test_the_log_stream_follows_new_lines_until_the_job_ends(
    client: TestClient, repo: JobRepository
) -> None:
    job_id = client.post("/v1/jobs", json=body()).json()["id"]
    repo.append_logs(job_id, 1, [(0, 1, "before the stream"), (1, 1, "rank 1 says hi")])

    def later() -> None:
        time.sleep(0.3)  # the stream is open by now, waiting for more
        repo.append_logs(job_id, 1, [(0, 2, "while streaming")])
        time.sleep(0.3)
        client.post(f"/v1/jobs/{job_id}/cancel")

    writer = threading.Thread(target=later)
    writer.start()
    response = client.get(f"/v1/jobs/{job_id}/logs/stream")
    writer.join()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    lines = [json.loads(data)["line"] for event, _, data in events if event == "line"]
    assert lines == ["before the stream", "rank 1 says hi", "while streaming"]
    assert (events[-1][0], events[-1][2]) == ("end", '{"state": "CANCELLED"}')

    first_id = events[0][1]
    resumed = client.get(
        f"/v1/jobs/{job_id}/logs/stream", headers={"Last-Event-ID": first_id}, params={"rank": 0}
    )
    assert [json.loads(d)["line"] for e, _, d in sse_events(resumed) if e == "line"] == [
        "while streaming"
    ]
    paged = client.get(f"/v1/jobs/{job_id}/logs", params={"after": first_id}).json()["lines"]
    assert [x["line"] for x in paged] == ["rank 1 says hi", "while streaming"]
    assert client.get("/v1/jobs/999/logs/stream").status_code == 404


def test_metric_series_are_kept_per_step_and_thinned(
    client: TestClient, repo: JobRepository
) -> None:
    job_id = client.post("/v1/jobs", json=body()).json()["id"]
    for step in range(1, 11):
        point = ProgressPoint(step, loss=10.0 / step, tokens_per_s=100.0, step_time_s=0.5)
        repo.record_progress(job_id, 1, point)
    series = client.get(f"/v1/jobs/{job_id}/metrics").json()["points"]
    assert [p["step"] for p in series] == list(range(1, 11))
    assert series[-1]["loss"] == 1.0 and series[0]["step_time_s"] == 0.5
    thinned = client.get(f"/v1/jobs/{job_id}/metrics", params={"max_points": 4}).json()
    assert [p["step"] for p in thinned["points"]] == [1, 4, 7, 10]  # the newest kept
    assert client.get(f"/v1/jobs/{job_id}").json()["progress"]["step"] == 10
    repo.record_progress(job_id, 1, ProgressPoint(11, loss=0.9, comm_s=0.25, comm_bytes=4096.0))
    newest = client.get(f"/v1/jobs/{job_id}/metrics").json()["points"][-1]
    assert (newest["comm_s"], newest["comm_bytes"]) == (0.25, 4096.0)
    thinned = client.get(f"/v1/jobs/{job_id}/metrics", params={"max_points": 4}).json()
    assert [p["step"] for p in thinned["points"]] == [1, 4, 7, 11]  # 11 in 10's place
    assert client.get("/v1/jobs/999/metrics").status_code == 404


def test_queues_show_guarantees_usage_and_borrowed_gpus(repo: JobRepository) -> None:
    repo.replace_nodes(NODES)
    QueueRepository(repo.engine).put("research", QueueQuota(2, borrow_limit_gpus=2))
    with TestClient(create_app(repo), raise_server_exceptions=False) as client:
        first = client.post("/v1/jobs", json=body(queue="research")).json()["id"]
        second = client.post("/v1/jobs", json=body(queue="research")).json()["id"]
        client.post("/v1/jobs", json=body(queue="prod"))
        for job_id, node in ((first, "id-1"), (second, "id-2")):
            repo.transition(job_id, JobState.ADMITTED, reason="t", placement=[node, node])
        listed = {q["name"]: q for q in client.get("/v1/queues").json()}
    assert listed["research"] == {
        "name": "research",
        "guaranteed_gpus": 2,
        "borrow_limit_gpus": 2,
        "weight": 1.0,
        "gpus_in_use": 4,
        "gpus_borrowed": 2,  # the second job is beyond the guarantee
        "jobs_pending": 0,
        "jobs_holding_gpus": 2,
        "members": [],  # open to every user
    }
    assert listed["prod"]["guaranteed_gpus"] == 0 and listed["prod"]["borrow_limit_gpus"] is None
    assert listed["prod"]["jobs_pending"] == 1 and listed["prod"]["gpus_in_use"] == 0


def test_checkpoints_lists_the_complete_ones_oldest_first(
    repo: JobRepository, tmp_path: Path
) -> None:
    repo.replace_nodes(NODES)
    app = create_app(repo, checkpoint_root=tmp_path)
    with TestClient(app, raise_server_exceptions=False) as client:
        job_id = client.post("/v1/jobs", json=body()).json()["id"]
        assert client.get(f"/v1/jobs/{job_id}/checkpoints").json()["checkpoints"] == []
        directory = tmp_path / f"job-{job_id}"
        for step, complete in ((10, True), (20, True), (30, False)):  # 30: save in progress
            saved = directory / f"step-{step:08d}"
            saved.mkdir(parents=True)
            (saved / "__0_0.distcp").write_bytes(b"x" * step)
            if complete:
                (saved / ".metadata").write_bytes(b"m")
        listed = client.get(f"/v1/jobs/{job_id}/checkpoints").json()
        assert listed["directory"] == str(directory)
        assert [(c["step"], c["bytes"]) for c in listed["checkpoints"]] == [(10, 11), (20, 21)]
        assert client.get("/v1/jobs/999/checkpoints").status_code == 404


def test_checkpoints_in_a_store_are_listed_by_url_and_registered_as_model_versions(
    repo: JobRepository, tmp_path: Path
) -> None:
    """With GANGWAY_STORAGE_URL the listing comes from the store (complete: .metadata
    and every rank's marker), and a model version is registered from a checkpoint there
    into the store's models (fetched, then sent up with each file's digest); a file is
    served only once fetched and checked, a changed one refused; deleting the version
    deletes its files."""
    repo.replace_nodes(NODES)
    store = CheckpointStore(f"memory://api-{tmp_path.name}/ckpt")
    models = RemoteModelFiles(f"memory://api-{tmp_path.name}/models")
    app = create_app(
        repo,
        checkpoint_root=tmp_path,
        checkpoint_store=store,
        models_root=tmp_path / "models",
        model_store=models,
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        job_id = client.post("/v1/jobs", json=body()).json()["id"]
        fs = store.job(job_id).fs
        for step, ranks in ((10, (0, 1)), (20, (0,))):  # 20: rank 1 not uploaded yet
            base = f"{store.job_url(job_id)}/attempt-1/step-{step:08d}"
            fs.pipe_file(f"{base}/.metadata", b"m")
            for rank in ranks:
                fs.pipe_file(f"{base}/__{rank}_0.distcp", b"x" * step)
                fs.pipe_file(f"{base}/.ranks/{rank}-of-2", b"")
        listed = client.get(f"/v1/jobs/{job_id}/checkpoints").json()
        assert listed["directory"] == store.job_url(job_id)
        assert [(c["step"], c["bytes"]) for c in listed["checkpoints"]] == [(10, 21)]
        assert listed["checkpoints"][0]["path"].endswith("attempt-1/step-00000010")
        missing = client.post("/v1/models", json={"name": "gpt", "job_id": job_id, "step": 20})
        assert missing.status_code == 422 and "it has: 10" in missing.text, missing.text
        made = client.post("/v1/models", json={"name": "gpt", "job_id": job_id})
        assert made.status_code == 201, made.text
        version = made.json()
        assert version["step"] == 10
        assert sorted(f["path"] for f in version["files"]) == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
        ]
        assert not (tmp_path / "models").exists()  # in the store alone
        stored = f"{models.version_url('gpt', 1)}/__1_0.distcp"
        assert models.fs.cat_file(stored) == b"x" * 10
        served = client.get("/v1/models/gpt/versions/1/files/__1_0.distcp")
        assert (served.status_code, served.content) == (200, b"x" * 10)
        models.fs.pipe_file(stored, b"y" * 10)  # changed in the store behind the registry
        changed = client.get("/v1/models/gpt/versions/1/files/__1_0.distcp")
        assert changed.status_code == 409 and b"y" not in changed.content, changed.text
        second = client.post("/v1/models", json={"name": "gpt", "job_id": job_id}).json()
        assert client.delete("/v1/models/gpt/versions/1").status_code == 204
        assert not models.fs.exists(models.version_url("gpt", 1))
        assert models.fs.exists(models.version_url("gpt", second["version"]))
        # a file S3 would store under another's name (w?versionId=1 as w): refused
        base = f"{store.job_url(job_id)}/attempt-1/step-00000030"
        for name in (".metadata", "w", "w?versionId=1", ".ranks/0-of-1"):
            fs.pipe_file(f"{base}/{name}", b"e")
        aliased = client.post("/v1/models", json={"name": "gpt", "job_id": job_id, "step": 30})
        assert aliased.status_code == 422, aliased.text
        assert aliased.json()["error"]["field"] == "job_id" and "versionId" in aliased.text

        class Unreachable(JobCheckpointStore):  # the store or the network down
            def listing(self) -> Any:
                raise ConnectionError("could not connect to the endpoint URL")

        app.state.checkpoint_store.job = lambda job: Unreachable(store.job_url(job))
        for response in (
            client.get(f"/v1/jobs/{job_id}/checkpoints"),
            client.post("/v1/models", json={"name": "gpt", "job_id": job_id}),
        ):
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "storage_unavailable"


def test_serve_hands_its_settings_to_the_app(tmp_path: Path) -> None:
    """`gangway serve` builds the app the tests build by hand: same checkpoint root as the
    ranks, queues seeded from the settings into the store the scheduler reads, auth as
    the settings say (the lifespan, which starts Ray, does not run)."""
    queues = {"research": {"guaranteed_gpus": 2}}
    settings = Settings(data_dir=tmp_path, queues=queues, admin_key="k" * 16)
    app = build_app(settings)
    assert app.state.checkpoint_root == tmp_path / "checkpoints" == settings.checkpoint_root()
    assert app.state.queue_store.quotas() == settings.quotas()
    assert app.state.auth.required is False and app.state.auth.admin_key == "k" * 16
    app.state.queue_store.put("research", QueueQuota(guaranteed_gpus=3))
    again = build_app(Settings(data_dir=tmp_path, queues=queues, auth=True))
    assert again.state.queue_store.quotas()["research"].guaranteed_gpus == 3  # not reseeded
    assert again.state.auth.required is True
