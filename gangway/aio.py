"""The SDK's async client: `AsyncClient` and `AsyncJob`, for asyncio programs (a notebook,
a pipeline driver watching many jobs at once). Same calls, same answers and errors as
`Client`: both send what `gangway.calls` describes.

    async with AsyncClient(url, api_key=key) as client:
        job = await client.submit(name="demo", entrypoint=Builtin(steps=50))
        async for line in job.follow_logs():
            print(line.text)
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx
from httpx_sse import aconnect_sse
from pydantic import PrivateAttr

from gangway import calls
from gangway.calls import Call
from gangway.client import api_error, auth_headers, has_ended, listed, read_answer
from gangway.downloads import PartFile, destination
from gangway.errors import NotFound, TransportError, Unavailable
from gangway.logfollow import END, LogCursor
from gangway.models import (
    JobCheckpoints,
    JobDependencies,
    JobEvent,
    JobExplanation,
    JobInfo,
    JobSubmit,
    LogLine,
    MetricPoint,
    OutputFile,
    ReportedValues,
)
from gangway.packaging import DEFAULT_MAX_BYTES, Shipped, pack

P = ParamSpec("P")
T = TypeVar("T")


def _sends(build: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncClient, P], Awaitable[T]]:
    @functools.wraps(build)
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.send(build(*args, **kwargs))

    return method


def _sends_job(
    build: Callable[P, Call[JobInfo]],
) -> Callable[Concatenate[AsyncClient, P], Awaitable[AsyncJob]]:
    @functools.wraps(build)
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncJob:
        return AsyncJob.bind(await self.send(build(*args, **kwargs)), self)

    return method


class AsyncClient:
    """`AsyncClient(url, api_key=...)`; `transport=` takes an `httpx.AsyncBaseTransport`
    (an `httpx.MockTransport`, or `httpx.ASGITransport(app)` to test against the app)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=auth_headers(api_key), timeout=timeout_s, transport=transport
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def ship(self, working_dir: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Shipped:
        """`Client.ship`: packs in a thread, uploads unless the service has the tree."""
        package = await asyncio.to_thread(pack, Path(working_dir), max_bytes=max_bytes)
        try:
            await self.send(calls.package(package.sha256))
            return Shipped(package.sha256, 0)
        except NotFound:
            await self.send(calls.upload_package(package.sha256, package.data))
            return Shipped(package.sha256, len(package.data))

    async def submit(
        self,
        spec: JobSubmit | None = None,
        *,
        idempotency_key: str | None = None,
        working_dir: str | Path | None = None,
        **fields: Any,
    ) -> AsyncJob:
        """`Client.submit`, awaited."""
        package = (await self.ship(working_dir)).sha256 if working_dir is not None else None
        call = calls.submit(spec, idempotency_key=idempotency_key, package=package, **fields)
        return AsyncJob.bind(await self.send(call), self)

    get = _sends_job(calls.get)
    estimate = _sends(calls.estimate)
    prediction_accuracy = _sends(calls.prediction_accuracy)
    list = _sends(calls.list_jobs)
    set_priority = _sends_job(calls.set_priority)
    cancel = _sends_job(calls.cancel)
    explain = _sends(calls.explain)
    dependencies = _sends(calls.dependencies)
    submit_pipeline = _sends(calls.submit_pipeline)
    pipeline = _sends(calls.pipeline)
    cancel_pipeline = _sends(calls.cancel_pipeline)
    submit_sweep = _sends(calls.submit_sweep)
    sweep = _sends(calls.sweep)
    cancel_sweep = _sends(calls.cancel_sweep)
    events = _sends(calls.events)
    logs = _sends(calls.logs)
    metrics = _sends(calls.metrics)
    metric_page = _sends(calls.metric_page)
    register_model = _sends(calls.register_model)
    models = _sends(calls.models)
    model = _sends(calls.model)
    model_version = _sends(calls.model_version)
    set_alias = _sends(calls.set_alias)
    remove_alias = _sends(calls.remove_alias)
    set_model_readers = _sends(calls.set_model_readers)
    delete_model_version = _sends(calls.delete_model_version)
    export_model = _sends_job(calls.export_model)
    checkpoints = _sends(calls.checkpoints)
    outputs_page = _sends(calls.outputs)
    cluster = _sends(calls.cluster)
    queues = _sends(calls.queues)
    set_queue = _sends(calls.set_queue)
    set_queue_members = _sends(calls.set_queue_members)
    delete_queue = _sends(calls.delete_queue)
    calibrate = _sends(calls.calibrate)
    whoami = _sends(calls.whoami)
    users = _sends(calls.users)
    create_user = _sends(calls.create_user)
    issue_key = _sends(calls.issue_key)
    keys = _sends(calls.keys)
    revoke_key = _sends(calls.revoke_key)

    async def follow_logs(
        self,
        job_id: int,
        *,
        rank: int | None = None,
        tail: int = 200,
        max_reconnects: int = 5,
        backoff_s: float = 0.5,
    ) -> AsyncIterator[LogLine]:
        """The last `tail` lines, then each new one as it is printed, until the job ends;
        a dropped connection resumes after the last line seen (see `Client.follow_logs`)."""
        call = calls.log_stream(job_id, rank=rank, tail=tail)
        cursor = LogCursor(max_reconnects=max_reconnects, backoff_s=backoff_s)
        while True:
            cause: Exception | None = None
            try:
                async with aconnect_sse(
                    self._http,
                    call.method,
                    call.path,
                    params=call.params,
                    headers=cursor.headers(),
                    timeout=None,
                ) as source:
                    if source.response.is_error:
                        await source.response.aread()
                        raise api_error(source.response)
                    async for event in source.aiter_sse():
                        item = cursor.take(event)
                        if item is END:
                            return
                        if isinstance(item, LogLine):
                            yield item
            except httpx.TransportError as exc:
                cause = exc
            await asyncio.sleep(cursor.dropped(str(self._http.base_url), cause))

    async def wait(
        self,
        job_id: int,
        timeout_s: float = 600.0,
        *,
        poll_s: float = 1.0,
        on_poll: Callable[[AsyncJob], object] | None = None,
    ) -> AsyncJob:
        """Until the job ends, without blocking the event loop. Raises `JobFailed` unless
        it SUCCEEDED, `WaitTimeout` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                job = await self.get(job_id)
            except (Unavailable, TransportError):  # a blip: the job has not changed
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(poll_s)
                continue
            if on_poll is not None:
                on_poll(job)
            if has_ended(job, deadline, timeout_s):
                return job
            await asyncio.sleep(poll_s)

    async def metric_points(
        self, job_id: int, names: Sequence[str] = ()
    ) -> builtins.list[ReportedValues]:
        """Every point the job reported (all pages), in order of arrival; with `names`,
        the points carrying one of them, with only those values."""
        points: list[ReportedValues] = []
        after: int | None = None
        while True:
            page = await self.metric_page(job_id, names=names, after=after)
            points.extend(page.reported)
            if page.next_cursor is None:
                return points
            after = page.next_cursor

    async def outputs(self, job_id: int, *, rank: int | None = None) -> builtins.list[OutputFile]:
        """`Client.outputs`: every page, awaited."""
        files: list[OutputFile] = []
        cursor: str | None = None
        while True:
            page = await self.outputs_page(job_id, rank=rank, cursor=cursor)
            files.extend(page.files)
            if page.next_cursor is None:
                return files
            cursor = page.next_cursor

    async def download(
        self,
        job_id: int,
        path: str | None = None,
        to: str | Path = ".",
        *,
        rank: int | None = None,
    ) -> builtins.list[Path]:
        """`Client.download`; files are written from a thread, so the loop never waits
        on the disk."""
        if path is not None:
            wanted: list[tuple[str, int | None]] = [(path, rank)]
        else:
            wanted = listed(await self.outputs(job_id, rank=rank))
        targets = [(p, r, destination(to, p)) for p, r in wanted]
        return [
            await self._save(calls.output_file(job_id, p, rank=r), dest) for p, r, dest in targets
        ]

    async def download_model(
        self, name: str, ref: str | int, to: str | Path = "."
    ) -> builtins.list[Path]:
        """Every file of version `ref` (a number or an alias) of model `name`, written
        under `to` at its relative path; each checked against its SHA-256 by the server
        before it is sent and here before it is renamed into place."""
        version = await self.model_version(name, ref)
        written = []
        for f in version.files:
            call = calls.model_file(name, version.version, f.path)
            written.append(await self._save(call, destination(to, f.path), sha256=f.sha256))
        return written

    async def _save(self, call: Call[None], dest: Path, sha256: str | None = None) -> Path:
        try:
            async with self._http.stream(
                call.method, call.path, params=call.params, headers=call.headers
            ) as response:
                if response.is_error:
                    await response.aread()
                    raise api_error(response)
                part = await asyncio.to_thread(PartFile.open, dest, sha256)
                try:
                    async for chunk in response.aiter_bytes():
                        await asyncio.to_thread(part.write, chunk)
                except BaseException:
                    await asyncio.to_thread(part.discard)
                    raise
                await asyncio.to_thread(part.commit)
        except httpx.TransportError as exc:
            raise TransportError(f"cannot reach Gangway at {self._http.base_url}: {exc}") from exc
        return dest

    async def send(self, call: Call[T]) -> T:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                headers=call.headers,
                content=call.content,
            )
        except httpx.TransportError as exc:
            raise TransportError(f"cannot reach Gangway at {self._http.base_url}: {exc}") from exc
        return read_answer(call, response)


class AsyncJob(JobInfo):
    """`Job` for `AsyncClient`: the same calls, awaited."""

    _client: AsyncClient = PrivateAttr()

    @classmethod
    def bind(cls, info: JobInfo, client: AsyncClient) -> AsyncJob:
        job = cls.model_validate(info, from_attributes=True)
        job._client = client
        return job

    async def reload(self) -> AsyncJob:
        return await self._client.get(self.id)

    async def wait(self, timeout_s: float = 600.0, *, poll_s: float = 1.0) -> AsyncJob:
        return await self._client.wait(self.id, timeout_s, poll_s=poll_s)

    async def cancel(self) -> AsyncJob:
        return await self._client.cancel(self.id)

    async def set_priority(self, priority: int) -> AsyncJob:
        return await self._client.set_priority(self.id, priority)

    async def explain(self) -> JobExplanation:
        return await self._client.explain(self.id)

    async def dependencies(self) -> JobDependencies:
        return await self._client.dependencies(self.id)

    async def events(self) -> list[JobEvent]:
        return await self._client.events(self.id)

    async def metrics(self, *, max_points: int = 500) -> list[MetricPoint]:
        return await self._client.metrics(self.id, max_points=max_points)

    async def metric_points(self, *names: str) -> list[ReportedValues]:
        """Every point the job reported (see `Client.metric_points`)."""
        return await self._client.metric_points(self.id, names)

    async def checkpoints(self) -> JobCheckpoints:
        return await self._client.checkpoints(self.id)

    async def outputs(self, rank: int | None = None) -> list[OutputFile]:
        return await self._client.outputs(self.id, rank=rank)

    async def download(
        self, path: str | None = None, to: str | Path = ".", rank: int | None = None
    ) -> list[Path]:
        return await self._client.download(self.id, path, to, rank=rank)

    async def logs(self, *, rank: int | None = None, tail: int = 200) -> list[LogLine]:
        return await self._client.logs(self.id, rank=rank, tail=tail)

    def follow_logs(self, *, rank: int | None = None, tail: int = 200) -> AsyncIterator[LogLine]:
        """`async for line in job.follow_logs()`: live lines until the job ends."""
        return self._client.follow_logs(self.id, rank=rank, tail=tail)
