"""The Python SDK: a thin, typed client over the REST API (httpx, injectable transport)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, TypeVar, overload

import httpx
from pydantic import BaseModel, PrivateAttr, TypeAdapter, ValidationError

from gangway.errors import (
    JobFailed,
    TransportError,
    WaitTimeout,
    error_for_status,
    validation_failed,
)
from gangway.models import (
    ClusterInfo,
    JobCheckpoints,
    JobEvent,
    JobExplanation,
    JobInfo,
    JobLogs,
    JobMetrics,
    JobPage,
    JobPatch,
    JobState,
    JobSubmit,
    LogLine,
    MetricPoint,
    QueueInfo,
)

M = TypeVar("M", bound=BaseModel)

JobEvents = list[JobEvent]
LogLines = list[LogLine]
MetricPoints = list[MetricPoint]
QueueInfos = list[QueueInfo]
_QUEUES = TypeAdapter(QueueInfos)
_EVENTS = TypeAdapter(JobEvents)


class Client:
    """`Client("http://127.0.0.1:8000")`; pass `transport=` to test without a server."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout_s, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- jobs -------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSubmit | None = None,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Job:
        """Submit a job: `submit(JobSubmit(...))` or `submit(name=..., entrypoint=Builtin())`.

        With an `idempotency_key` a submission is safe to retry (after a `TransportError`,
        say): the same key returns the job the first attempt made, never a second one."""
        if spec is None:
            try:
                spec = JobSubmit(**fields)
            except ValidationError as exc:
                raise validation_failed(exc) from exc
        body = spec.model_dump(mode="json", exclude_unset=False)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._job("POST", "/v1/jobs", json=body, headers=headers)

    def get(self, job_id: int) -> Job:
        return self._job("GET", f"/v1/jobs/{job_id}")

    def list(
        self,
        *,
        state: JobState | str | Sequence[JobState | str] | None = None,
        queue: str | None = None,
        user: str | None = None,
        name_prefix: str | None = None,
        limit: int = 50,
        cursor: int | None = None,
    ) -> JobPage:
        """Newest first; pass `cursor=page.next_cursor` for the next page."""
        states = [state] if isinstance(state, str) else list(state or ())
        filters = {"queue": queue, "user": user, "name_prefix": name_prefix, "cursor": cursor}
        params: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
        params["limit"] = limit
        if states:
            params["state"] = [str(s) for s in states]
        return self._call("GET", "/v1/jobs", JobPage, params=params)

    def set_priority(self, job_id: int, priority: int) -> Job:
        """Reorder a pending job, or re-rank a running one for preemption."""
        body = JobPatch(priority=priority).model_dump()
        return self._job("PATCH", f"/v1/jobs/{job_id}", json=body)

    def explain(self, job_id: int) -> JobExplanation:
        """Why the job is where it is; for a pending one: blocker, queue position, ETA."""
        return self._call("GET", f"/v1/jobs/{job_id}/explain", JobExplanation)

    def cancel(self, job_id: int) -> Job:
        return self._job("POST", f"/v1/jobs/{job_id}/cancel")

    def events(self, job_id: int) -> JobEvents:
        return _EVENTS.validate_python(self._request("GET", f"/v1/jobs/{job_id}/events").json())

    def logs(self, job_id: int, *, rank: int | None = None, tail: int = 200) -> LogLines:
        """The last `tail` lines the job's ranks printed (all attempts), oldest first."""
        params: dict[str, Any] = {"tail": tail}
        if rank is not None:
            params["rank"] = rank
        return self._call("GET", f"/v1/jobs/{job_id}/logs", JobLogs, params=params).lines

    def metrics(self, job_id: int, *, max_points: int = 500) -> MetricPoints:
        """Loss, tokens/s, step time and memory over steps, thinned to `max_points`."""
        params = {"max_points": max_points}
        return self._call("GET", f"/v1/jobs/{job_id}/metrics", JobMetrics, params=params).points

    def checkpoints(self, job_id: int) -> JobCheckpoints:
        """The job's complete checkpoints, oldest first (it resumes from the last)."""
        return self._call("GET", f"/v1/jobs/{job_id}/checkpoints", JobCheckpoints)

    def follow_logs(
        self, job_id: int, *, rank: int | None = None, tail: int = 200
    ) -> Iterator[LogLine]:
        """The last `tail` lines, then each new one as the ranks print it, until the job
        ends (Server-Sent Events from `/logs/stream`)."""
        params: dict[str, Any] = {"tail": tail}
        if rank is not None:
            params["rank"] = rank
        url = f"/v1/jobs/{job_id}/logs/stream"
        try:
            with self._http.stream("GET", url, params=params, timeout=None) as response:
                if response.is_error:
                    response.read()
                    raise _api_error(response)
                for event, data in _server_sent_events(response.iter_lines()):
                    if event == "end":
                        return
                    if event == "line":
                        yield LogLine.model_validate_json(data)
        except httpx.TransportError as exc:
            raise TransportError(f"lost the log stream from {self._http.base_url}: {exc}") from exc

    def wait(
        self,
        job_id: int,
        timeout_s: float = 600.0,
        *,
        poll_s: float = 1.0,
        on_poll: Callable[[Job], object] | None = None,
    ) -> Job:
        """Block until the job ends. Raises `JobFailed` unless it SUCCEEDED. `on_poll`
        sees the job at every poll (a progress bar, say)."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(job_id)
            if on_poll is not None:
                on_poll(job)
            if job.state is JobState.SUCCEEDED:
                return job
            if job.state.is_terminal:
                raise JobFailed(job)
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job_id} still {job.state} after {timeout_s} s")
            time.sleep(poll_s)

    # -- cluster ----------------------------------------------------------------------

    def cluster(self) -> ClusterInfo:
        return self._call("GET", "/v1/cluster", ClusterInfo)

    def queues(self) -> QueueInfos:
        """Each queue's guarantee and borrowing limit, GPUs in use and borrowed now."""
        return _QUEUES.validate_python(self._request("GET", "/v1/queues").json())

    # -- plumbing ---------------------------------------------------------------------

    def _job(self, method: str, path: str, **kwargs: Any) -> Job:
        job = self._call(method, path, Job, **kwargs)
        job._client = self
        return job

    def _call(self, method: str, path: str, model: type[M], **kwargs: Any) -> M:
        return model.model_validate(self._request(method, path, **kwargs).json())

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise TransportError(f"cannot reach Gangway at {self._http.base_url}: {exc}") from exc
        if response.is_error:
            raise _api_error(response)
        return response


class Job(JobInfo):
    """A job as the service last described it (every `JobInfo` field), with the calls
    that act on it: `job.wait()`, `job.logs(follow=True)`, `job.explain()`, ... Calls that
    return the job return a fresh `Job`; this one does not change."""

    _client: Client = PrivateAttr()

    def reload(self) -> Job:
        return self._client.get(self.id)

    def wait(self, timeout_s: float = 600.0, *, poll_s: float = 1.0) -> Job:
        """Until the job ends; raises `JobFailed` (with the job's error) unless it
        SUCCEEDED, `WaitTimeout` after `timeout_s`."""
        return self._client.wait(self.id, timeout_s, poll_s=poll_s)

    def cancel(self) -> Job:
        return self._client.cancel(self.id)

    def set_priority(self, priority: int) -> Job:
        return self._client.set_priority(self.id, priority)

    def explain(self) -> JobExplanation:
        return self._client.explain(self.id)

    def events(self) -> JobEvents:
        return self._client.events(self.id)

    def metrics(self, *, max_points: int = 500) -> MetricPoints:
        return self._client.metrics(self.id, max_points=max_points)

    def checkpoints(self) -> JobCheckpoints:
        return self._client.checkpoints(self.id)

    @overload
    def logs(
        self, *, rank: int | None = None, tail: int = 200, follow: Literal[False] = False
    ) -> LogLines: ...

    @overload
    def logs(
        self, *, rank: int | None = None, tail: int = 200, follow: Literal[True]
    ) -> Iterator[LogLine]: ...

    def logs(
        self, *, rank: int | None = None, tail: int = 200, follow: bool = False
    ) -> LogLines | Iterator[LogLine]:
        """The last `tail` lines; with `follow=True` an iterator that goes on yielding new
        lines until the job ends."""
        if follow:
            return self._client.follow_logs(self.id, rank=rank, tail=tail)
        return self._client.logs(self.id, rank=rank, tail=tail)


def _server_sent_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) per event of a text/event-stream; comments and ids are skipped."""
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def _api_error(response: httpx.Response) -> Exception:
    try:
        detail = response.json()["error"]
        code, message, field = detail["code"], detail["message"], detail.get("field")
    except (ValueError, KeyError, TypeError):
        code, message, field = "http_error", response.text[:500], None
    return error_for_status(response.status_code, code, message, field)
