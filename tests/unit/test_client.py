"""The SDK against httpx.MockTransport: requests it sends, typed errors, wait()."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gangway import (
    AsyncClient,
    Builtin,
    Client,
    Conflict,
    Job,
    JobFailed,
    NotFound,
    Parallelism,
    TransportError,
    Unauthorized,
    Unavailable,
    ValidationFailed,
    WaitTimeout,
)


def job_json(job_id: int = 7, state: str = "PENDING", **extra: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "name": "demo",
        "queue": "default",
        "user": "default",
        "priority": 0,
        "state": state,
        "status_reason": "waiting",
        "error": extra.get("error"),
        "num_gpus": 2,
        "attempt": 0,
        "restarts": 0,
        "submitted_at": "2026-01-01T00:00:00Z",
        "admitted_at": None,
        "started_at": None,
        "finished_at": None,
        "spec": {"name": "demo", "entrypoint": {"kind": "builtin"}},
        "placement": None,
        "progress": {
            "step": 0,
            "total_steps": 100,
            "loss": None,
            "first_loss": None,
            "tokens_per_s": None,
            "updated_at": None,
        },
    }


def client_for(handler: Callable[[httpx.Request], httpx.Response]) -> Client:
    return Client("http://gangway.test", api_key="secret", transport=httpx.MockTransport(handler))


def test_submit_posts_the_full_spec_with_auth() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json=job_json())

    job = client_for(handler).submit(
        name="demo", parallelism=Parallelism(dp=2), entrypoint=Builtin(steps=5)
    )
    assert job.id == 7
    (request,) = seen
    assert (request.method, request.url.path) == ("POST", "/v1/jobs")
    assert request.headers["authorization"] == "Bearer secret"
    sent = json.loads(request.content)
    assert sent["parallelism"] == {"dp": 2, "tp": 1, "pp": 1, "fsdp": False}
    assert sent["entrypoint"]["steps"] == 5


def test_local_validation_names_the_field_before_any_request() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    with pytest.raises(ValidationFailed) as info:
        client_for(handler).submit(name="x", entrypoint=Builtin(), parallelism={"dp": 0})
    assert info.value.field == "parallelism.dp"


@pytest.mark.parametrize(
    ("status", "code", "error_type"),
    [
        (404, "not_found", NotFound),
        (409, "conflict", Conflict),
        (422, "validation_error", ValidationFailed),
    ],
)
def test_error_bodies_become_typed_errors(
    status: int, code: str, error_type: type[Exception]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, json={"error": {"code": code, "message": "nope", "field": "f"}}
        )

    with pytest.raises(error_type) as info:
        client_for(handler).get(1)
    assert info.value.code == code  # type: ignore[attr-defined]
    assert info.value.field == "f"  # type: ignore[attr-defined]


def test_unreachable_server_is_a_transport_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(TransportError, match="cannot reach Gangway"):
        client_for(handler).get(1)


def test_wait_returns_on_success_and_raises_on_failure() -> None:
    states = iter(["PENDING", "RUNNING", "SUCCEEDED"])

    def succeed(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=job_json(state=next(states)))

    assert client_for(succeed).wait(7, poll_s=0).state == "SUCCEEDED"

    def fail(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=job_json(state="FAILED", error="RuntimeError: boom"))

    with pytest.raises(JobFailed, match="boom") as info:
        client_for(fail).wait(7, poll_s=0)
    assert info.value.job.id == 7


def test_wait_rides_out_a_service_that_cannot_reach_its_database() -> None:
    answers = iter([503, 503, 200])

    def blip(request: httpx.Request) -> httpx.Response:
        status = next(answers)
        if status == 503:
            body = {"error": {"code": "database_unavailable", "message": "later", "field": None}}
            return httpx.Response(503, json=body, headers={"Retry-After": "5"})
        return httpx.Response(200, json=job_json(state="SUCCEEDED"))

    assert client_for(blip).wait(7, poll_s=0).state == "SUCCEEDED"

    def down(request: httpx.Request) -> httpx.Response:
        body = {"error": {"code": "database_unavailable", "message": "later", "field": None}}
        return httpx.Response(503, json=body)

    with pytest.raises(Unavailable):  # for no longer than the wait's own timeout
        client_for(down).wait(7, timeout_s=0, poll_s=0)


def test_wait_times_out() -> None:
    def pending(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=job_json(state="PENDING"))

    with pytest.raises(WaitTimeout):
        client_for(pending).wait(7, timeout_s=0, poll_s=0)


def test_list_passes_filters_and_cursor() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert dict(request.url.params) == {"limit": "10", "state": "RUNNING", "cursor": "5"}
        return httpx.Response(200, json={"items": [job_json(state="RUNNING")], "next_cursor": None})

    page = client_for(handler).list(state="RUNNING", limit=10, cursor=5)
    assert [j.state for j in page.items] == ["RUNNING"]


def test_list_sends_every_filter_and_repeats_states() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params.get_list("state") == ["PENDING", "RUNNING"]
        assert (request.url.params["queue"], request.url.params["user"]) == ("prod", "ana")
        assert request.url.params["name_prefix"] == "bert"
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    page = client_for(handler).list(
        state=["PENDING", "RUNNING"], queue="prod", user="ana", name_prefix="bert"
    )
    assert page.items == []


def test_priority_and_explain() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH":
            assert request.url.path == "/v1/jobs/7"
            assert json.loads(request.content) == {"priority": 4}
            return httpx.Response(200, json={**job_json(), "priority": 4})
        assert request.url.path == "/v1/jobs/7/explain"
        explained = {
            "job_id": 7,
            "state": "PENDING",
            "reason": "needs 2 GPUs",
            "queue": "default",
            "priority": 4,
            "queue_position": 1,
            "attained_gpu_hours": 0.0,
        }
        return httpx.Response(200, json=explained)

    client = client_for(handler)
    assert client.set_priority(7, 4).priority == 4
    assert client.explain(7).queue_position == 1


def test_follow_logs_reads_server_sent_events_until_the_end_event() -> None:
    line = {"attempt": 1, "rank": 0, "seq": 1, "line": "step 1", "id": 5}
    stream = (
        f"id: 5\nevent: line\ndata: {json.dumps(line)}\n\n"
        ": keep-alive\n\n"
        'event: end\ndata: {"state": "SUCCEEDED"}\n\n'
        f"id: 6\nevent: line\ndata: {json.dumps(line)}\n\n"  # after the end: never read
    )

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/jobs/7/logs/stream"
        assert dict(request.url.params) == {"tail": "10", "rank": "0"}
        return httpx.Response(200, text=stream, headers={"content-type": "text/event-stream"})

    lines = list(client_for(handler).follow_logs(7, rank=0, tail=10))
    assert [(x.line, x.id) for x in lines] == [("step 1", 5)]


def test_follow_logs_raises_the_typed_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        error = {"code": "not_found", "message": "job 7 not found", "field": None}
        return httpx.Response(404, json={"error": error, "errors": [error]})

    with pytest.raises(NotFound):
        list(client_for(handler).follow_logs(7))


SSE = {"content-type": "text/event-stream"}


def sse_line(cursor: int, text: str) -> str:
    line = {"attempt": 1, "rank": 0, "seq": cursor, "line": text, "id": cursor}
    return f"id: {cursor}\nevent: line\ndata: {json.dumps(line)}\n\n"


def dropping_stream_handler(seen: list[str | None]) -> Callable[[httpx.Request], httpx.Response]:
    """1st connection: one line, then the stream closes before the end event; 2nd: the
    connection fails; 3rd: the next line and the end event."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Last-Event-ID"))
        if len(seen) == 1:
            return httpx.Response(200, text=sse_line(5, "step 1"), headers=SSE)
        if len(seen) == 2:
            raise httpx.ReadError("connection reset by peer")
        stream = sse_line(6, "step 2") + 'event: end\ndata: {"state": "SUCCEEDED"}\n\n'
        return httpx.Response(200, text=stream, headers=SSE)

    return handler


def test_follow_logs_resumes_a_dropped_stream_after_the_last_line() -> None:
    seen: list[str | None] = []
    client = client_for(dropping_stream_handler(seen))
    lines = list(client.follow_logs(7, backoff_s=0))
    assert [(x.line, x.id) for x in lines] == [("step 1", 5), ("step 2", 6)]
    assert seen == [None, "5", "5"]  # no gap, no repeat


def test_the_async_client_resumes_a_dropped_stream_too() -> None:
    seen: list[str | None] = []

    async def scenario() -> list[int]:
        async with async_client_for(dropping_stream_handler(seen)) as client:
            return [x.id async for x in client.follow_logs(7, backoff_s=0)]

    assert asyncio.run(scenario()) == [5, 6]
    assert seen == [None, "5", "5"]


def test_follow_logs_gives_up_after_repeated_drops_without_progress() -> None:
    connections: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        connections.append(request)
        raise httpx.ConnectError("connection refused")

    with pytest.raises(TransportError, match="3 times in a row"):
        list(client_for(handler).follow_logs(7, max_reconnects=2, backoff_s=0))
    assert len(connections) == 3


def test_a_job_handle_acts_on_its_job() -> None:
    states = iter(["RUNNING", "SUCCEEDED"])
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path == "/v1/jobs/7/logs":
            line = {"attempt": 1, "rank": 0, "seq": 1, "line": "hi", "id": 1}
            return httpx.Response(200, json={"lines": [line]})
        if request.method == "POST" and request.url.path == "/v1/jobs":
            return httpx.Response(201, json=job_json())
        return httpx.Response(200, json=job_json(state=next(states, "SUCCEEDED")))

    client = client_for(handler)
    job = client.submit(name="demo", entrypoint=Builtin())
    assert isinstance(job, Job) and job.state == "PENDING"  # still every JobInfo field
    assert job.reload().state == "RUNNING"
    assert job.wait(timeout_s=5, poll_s=0).state == "SUCCEEDED"
    assert [x.line for x in job.logs(tail=1)] == ["hi"]
    assert job.cancel().id == 7
    assert seen == [
        "POST /v1/jobs",
        "GET /v1/jobs/7",
        "GET /v1/jobs/7",
        "GET /v1/jobs/7/logs",
        "POST /v1/jobs/7/cancel",
    ]


def test_wait_shows_every_poll() -> None:
    states = iter(["PENDING", "RUNNING", "SUCCEEDED"])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=job_json(state=next(states)))

    seen: list[str] = []
    done = client_for(handler).wait(7, poll_s=0, on_poll=lambda job: seen.append(job.state))
    assert done.state == "SUCCEEDED" and seen == ["PENDING", "RUNNING", "SUCCEEDED"]


def async_client_for(handler: Callable[[httpx.Request], httpx.Response]) -> AsyncClient:
    transport = httpx.MockTransport(handler)
    return AsyncClient("http://gangway.test", api_key="secret", transport=transport)


def test_the_async_client_sends_the_same_request_and_waits_without_blocking() -> None:
    seen: list[httpx.Request] = []
    states = iter(["RUNNING", "FAILED"])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(201, json=job_json())
        return httpx.Response(200, json=job_json(state=next(states), error="rank 1 died"))

    async def scenario() -> None:
        async with async_client_for(handler) as client:
            job = await client.submit(name="demo", entrypoint=Builtin(steps=5))
            with pytest.raises(JobFailed, match="rank 1 died"):
                await job.wait(poll_s=0)

    asyncio.run(scenario())
    assert seen[0].headers["authorization"] == "Bearer secret"
    assert "user" not in json.loads(seen[0].content)  # the server fills in the key's user
    assert [r.url.path for r in seen[1:]] == ["/v1/jobs/7", "/v1/jobs/7"]


def test_the_async_client_follows_logs_and_types_its_errors() -> None:
    line = {"attempt": 1, "rank": 0, "seq": 1, "line": "step 1", "id": 5}
    stream = f"event: line\ndata: {json.dumps(line)}\n\nevent: end\ndata: {{}}\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/stream"):
            return httpx.Response(200, text=stream, headers=SSE)
        error = {"code": "unauthorized", "message": "unknown key", "field": "Authorization"}
        return httpx.Response(401, json={"error": error, "errors": [error]})

    async def scenario() -> None:
        async with async_client_for(handler) as client:
            assert [x.line async for x in client.follow_logs(7)] == ["step 1"]
            with pytest.raises(Unauthorized) as refused:
                await client.whoami()
            assert refused.value.field == "Authorization"

    asyncio.run(scenario())


def test_an_unreachable_server_is_a_transport_error_for_the_async_client_too() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def scenario() -> None:
        async with async_client_for(handler) as client:
            await client.cluster()

    with pytest.raises(TransportError):
        asyncio.run(scenario())
