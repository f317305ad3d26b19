"""Limits (issue 15): body size, invalid text, field sizes, stored text, page size, stream
caps and telemetry retention, each on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.limits import Limits
from scheduler.model import JobState, Node
from scheduler.store import JobRepository, NewJob, ProgressPoint
from scheduler.store.records import ReportedPoint
from scheduler.store.retention import Retention, TelemetrySweeper
from scheduler.store.text_limits import CUT_MARK, MAX_ERROR_CHARS, MAX_REASON_CHARS

NODES = [Node("id-1", "local-1", 4, 8.0)]
LIMITS = Limits(max_body_bytes=64 * 1024, max_page_bytes=64 * 1024, streams_per_caller=1)


@pytest.fixture
def client(repo: JobRepository) -> Iterator[TestClient]:
    repo.replace_nodes(NODES)
    with TestClient(create_app(repo, limits=LIMITS), raise_server_exceptions=False) as client:
        yield client


def body(**overrides: Any) -> dict[str, Any]:
    return {"name": "demo", "entrypoint": {"kind": "builtin", "steps": 5}, **overrides}


def error_of(response: Any) -> tuple[int, str, str | None]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["field"]


def test_a_body_over_the_limit_is_413_by_length_or_by_streamed_bytes(
    client: TestClient, repo: JobRepository
) -> None:
    big = json.dumps(body(name="x" * 70_000)).encode()
    declared = client.post("/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert error_of(declared)[:2] == (413, "payload_too_large")
    assert "65536 bytes" in declared.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    json_type = {"content-type": "application/json"}
    streamed = client.post("/v1/jobs", content=chunks(), headers=json_type)
    assert "content-length" not in {k.lower() for k in streamed.request.headers}
    assert error_of(streamed)[:2] == (413, "payload_too_large")
    assert repo.page(limit=10) == []
    # uploads (another route family) bound their own size: the limit lets them through
    assert client.put("/v1/packages/x", content=big).status_code != 413


@pytest.mark.parametrize(
    ("request_args", "field"),
    [
        ({"json": body(name="a\x00b")}, "name"),
        ({"json": body(user="a\x00")}, "user"),
        ({"json": body(queue="q\x00")}, "queue"),
        ({"content": b'{"name": "\\ud800", "entrypoint": {}}'}, "name"),
        (
            {
                "json": body(
                    entrypoint={"kind": "function", "target": "a.b:c", "kwargs": {"n": "\x00"}}
                )
            },
            "entrypoint.kwargs.n",
        ),
        ({"json": body(entrypoint={"kind": "script", "path": "t.py", "args": ["\x00"]})}, None),
    ],
)
def test_nul_and_lone_surrogates_in_a_body_are_422_naming_the_field(
    client: TestClient, repo: JobRepository, request_args: dict[str, Any], field: str | None
) -> None:
    response = client.post("/v1/jobs", headers={"content-type": "application/json"}, **request_args)
    status, code, named = error_of(response)
    assert (status, code) == (422, "validation_error")
    assert named == (field or "entrypoint.args.0")
    assert repo.page(limit=10) == []


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/v1/jobs?name_prefix=a%00", "name_prefix"),
        ("/v1/jobs?user=%00", "user"),
        ("/v1/jobs?queue=q%00", "queue"),
        ("/v1/queues/q%00", "path"),
    ],
)
def test_nul_in_the_path_or_query_is_422_naming_it(
    client: TestClient, url: str, field: str
) -> None:
    assert error_of(client.get(url)) == (422, "validation_error", field)


def test_kwargs_and_script_args_have_size_limits(client: TestClient) -> None:
    kwargs = {"blob": "x" * 20_000}
    function = {"kind": "function", "target": "a.b:c", "kwargs": kwargs}
    response = client.post("/v1/jobs", json=body(entrypoint=function))
    assert error_of(response) == (422, "validation_error", "entrypoint.kwargs")
    assert "at most 16384" in response.json()["error"]["message"]
    script = {"kind": "script", "path": "t.py", "args": ["ok", "y" * 5000]}
    response = client.post("/v1/jobs", json=body(entrypoint=script))
    assert error_of(response) == (422, "validation_error", "entrypoint.args.1")
    response = client.post("/v1/jobs", json=body(name="n" * 201))
    assert error_of(response) == (422, "validation_error", "name")


def test_stored_errors_and_reasons_keep_their_tail(repo: JobRepository) -> None:
    job = repo.create(new_job())
    error = "".join(f"line {i}\n" for i in range(20_000)) + "RuntimeError: the cause"
    repo.transition(job.id, JobState.ADMITTED, reason="r", placement=["n"])
    repo.transition(job.id, JobState.STARTING, reason="r")
    record = repo.transition(job.id, JobState.FAILED, reason="why " * 1000, error=error)
    assert record.error is not None and len(record.error) == MAX_ERROR_CHARS
    assert record.error.startswith(CUT_MARK) and record.error.endswith("RuntimeError: the cause")
    assert len(record.status_reason) == MAX_REASON_CHARS
    assert len(repo.events(job.id)[-1].reason) == MAX_REASON_CHARS


def test_a_listing_ends_its_page_at_the_byte_budget(
    client: TestClient, repo: JobRepository
) -> None:
    kwargs = {"blob": "x" * 15_000}  # each job ~16 KB as JSON: 4 fit in 64 KiB
    spec = body(entrypoint={"kind": "function", "target": "a.b:c", "kwargs": kwargs})
    ids = [repo.create(replace(new_job(), spec=spec)).id for _ in range(10)]
    seen: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 500} | ({"cursor": cursor} if cursor else {})
        response = client.get("/v1/jobs", params=params)
        assert response.status_code == 200
        assert len(response.content) <= LIMITS.max_page_bytes + 20_000  # one item over, at most
        page = response.json()
        assert 1 <= len(page["items"]) < 10
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)  # every job once, newest first


def test_log_streams_are_capped_per_caller(client: TestClient, repo: JobRepository) -> None:
    job_id = client.post("/v1/jobs", json=body()).json()["id"]
    client.post(f"/v1/jobs/{job_id}/cancel")
    for _ in range(2):  # a finished stream gives its slot back
        assert client.get(f"/v1/jobs/{job_id}/logs/stream").status_code == 200
    slots = client.app.state.streams  # type: ignore[attr-defined]
    slots.take("testclient")  # this caller's one stream is open elsewhere
    refused = client.get(f"/v1/jobs/{job_id}/logs/stream")
    assert error_of(refused) == (429, "too_many_requests", None)
    assert "GANGWAY_STREAMS_PER_CALLER" in refused.json()["error"]["message"]
    assert refused.headers["Retry-After"]
    slots.give_back("testclient")
    assert client.get(f"/v1/jobs/{job_id}/logs/stream").status_code == 200


def new_job() -> NewJob:
    return NewJob(name="j", queue="default", priority=0, spec=body(), num_gpus=1, total_steps=5)


def test_retention_keeps_the_newest_lines_and_drops_old_telemetry(repo: JobRepository) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    now = [start]
    clocked = repo.with_clock(lambda: now[0])
    chatty, old, live = (clocked.create(new_job()) for _ in range(3))
    clocked.append_logs(chatty.id, 1, [(0, seq, f"line {seq}") for seq in range(1, 51)])
    clocked.append_logs(old.id, 1, [(0, 1, "long ago")])
    clocked.append_logs(live.id, 1, [(0, 1, "still running")])
    clocked.record_progress(live.id, 1, ProgressPoint(step=1, loss=2.0))
    clocked.transition(old.id, JobState.CANCELLED, reason="done")
    now[0] += timedelta(days=40)
    clocked.record_progress(live.id, 1, ProgressPoint(step=2, loss=1.0))
    reported = [ReportedPoint(seq, seq, 0.0, {"acc": 1.0}) for seq in range(1, 8)]
    clocked.append_points(old.id, 1, reported, None)  # months old, yet results: kept
    clocked.append_points(chatty.id, 1, reported, None)
    retention = Retention(
        log_lines_per_job=10, telemetry_age=timedelta(days=30), reported_points_per_job=5
    )
    sweeper = TelemetrySweeper(repo.engine, retention, lambda: now[0])

    pruned = sweeper.sweep()

    assert [x.line for x in repo.logs(chatty.id, tail=100)] == [
        f"line {seq}" for seq in range(41, 51)
    ]
    assert repo.logs(old.id) == []  # ended over 30 days ago: its lines go, the job stays
    assert repo.get(old.id).state is JobState.CANCELLED
    assert [x.line for x in repo.logs(live.id)] == ["still running"]
    assert [p.step for p in repo.metrics(live.id)] == [2]  # the 40-day-old point went
    assert (pruned.log_lines, pruned.metric_points, pruned.reported_points) == (41, 1, 4)
    for job_id in (old.id, chatty.id):  # the newest 5 of each job's reports stay
        assert [p.step for p in repo.reported_points(job_id)[0]] == [3, 4, 5, 6, 7]
    # a rank resending lines after a reattach does not bring pruned ones back
    assert clocked.append_logs(chatty.id, 1, [(0, 50, "line 50"), (0, 51, "line 51")]) == 1
    # the next sweep only looks at jobs that changed since
    clocked.append_logs(chatty.id, 1, [(0, seq, "more") for seq in range(52, 60)])
    assert sweeper.sweep().log_lines == 9


def test_a_job_stored_before_a_limit_existed_stays_readable(
    repo: JobRepository, client: TestClient
) -> None:
    """e1c70d8 accepted any size of kwargs and of script arguments: such a job, stored
    before the limits, must list and read as it was (not a 500 on every listing), while a
    new submit of the same body is refused."""
    big = {"blob": "x" * 20_000}  # over the 16 KiB kwargs limit, under the body limit
    old_function = body(entrypoint={"kind": "function", "target": "a.b:c", "kwargs": big})
    old_script = body(entrypoint={"kind": "script", "path": "/t.py", "args": ["y" * 5000]})
    ids = [
        repo.create(NewJob("old", "default", 0, spec, 1, None)).id
        for spec in (old_function, old_script)
    ]
    listed: set[int] = set()
    params: dict[str, int] = {"limit": 10}
    while True:  # a page may end early at its byte budget
        page = client.get("/v1/jobs", params=params)
        assert page.status_code == 200
        listed |= {job["id"] for job in page.json()["items"]}
        if page.json()["next_cursor"] is None:
            break
        params["cursor"] = page.json()["next_cursor"]
    assert listed >= set(ids)
    read = client.get(f"/v1/jobs/{ids[0]}").json()
    assert read["spec"]["entrypoint"]["kwargs"] == big
    assert client.get(f"/v1/jobs/{ids[1]}").json()["spec"]["entrypoint"]["args"] == ["y" * 5000]
    for spec, field in ((old_function, "kwargs"), (old_script, "args")):
        refused = client.post("/v1/jobs", json=spec)
        assert refused.status_code == 422 and field in refused.text
