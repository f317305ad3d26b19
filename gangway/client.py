"""The Python SDK's blocking client: `Client`, and `Job`, a job with the calls that act on
it. The async twin is `gangway.aio.AsyncClient`. Both send the calls `gangway.calls`
describes, over httpx with an injectable transport (`httpx.MockTransport` in tests).
"""

from __future__ import annotations

import builtins
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, overload

import httpx
from httpx_sse import connect_sse
from pydantic import PrivateAttr

from gangway import calls
from gangway.calls import Call
from gangway.downloads import PartFile, destination
from gangway.errors import (
    JobFailed,
    NotFound,
    TransportError,
    Unavailable,
    WaitTimeout,
    error_for_status,
)
from gangway.logfollow import END, LogCursor
from gangway.models import (
    JobCheckpoints,
    JobDependencies,
    JobEvent,
    JobExplanation,
    JobInfo,
    JobState,
    JobSubmit,
    LogLine,
    MetricPoint,
    OutputFile,
    ReportedValues,
)
from gangway.packaging import DEFAULT_MAX_BYTES, Shipped, pack

P = ParamSpec("P")
T = TypeVar("T")


def _sends(build: Callable[P, Call[T]]) -> Callable[Concatenate[Client, P], T]:
    """A `Client` method that sends what `build` describes and returns its answer."""

    @functools.wraps(build)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.send(build(*args, **kwargs))

    return method


def _sends_job(build: Callable[P, Call[JobInfo]]) -> Callable[Concatenate[Client, P], Job]:
    """A `Client` method whose answer is a job: returned as a `Job` bound to the client."""

    @functools.wraps(build)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> Job:
        return Job.bind(self.send(build(*args, **kwargs)), self)

    return method


class Client:
    """`Client("http://127.0.0.1:8000", api_key=...)`; pass `transport=` to test without a
    server. Methods that answer with a job return a `Job` (`job.wait()`, `job.logs()`...)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=auth_headers(api_key), timeout=timeout_s, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def ship(self, working_dir: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Shipped:
        """Pack a working directory (`gangway.packaging.pack`) and upload it unless the
        service has that exact tree already."""
        package = pack(Path(working_dir), max_bytes=max_bytes)
        try:
            self.send(calls.package(package.sha256))
            return Shipped(package.sha256, 0)
        except NotFound:
            self.send(calls.upload_package(package.sha256, package.data))
            return Shipped(package.sha256, len(package.data))

    def submit(
        self,
        spec: JobSubmit | None = None,
        *,
        idempotency_key: str | None = None,
        working_dir: str | Path | None = None,
        **fields: Any,
    ) -> Job:
        """Submit a job: `submit(JobSubmit(...))` or `submit(name=..., entrypoint=...)`.
        With `working_dir` the directory is shipped first (see `ship`) and the ranks run
        in it on every node; `requirements=[...]`, `env={...}` and `secrets={...}` (for
        the ranks; no response shows their values, a job lists their names) are job
        fields. With an `idempotency_key` a submission is safe to retry."""
        package = self.ship(working_dir).sha256 if working_dir is not None else None
        call = calls.submit(spec, idempotency_key=idempotency_key, package=package, **fields)
        return Job.bind(self.send(call), self)

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

    def follow_logs(
        self,
        job_id: int,
        *,
        rank: int | None = None,
        tail: int = 200,
        max_reconnects: int = 5,
        backoff_s: float = 0.5,
    ) -> Iterator[LogLine]:
        """The last `tail` lines, then each new one as the ranks print it, until the job
        ends (Server-Sent Events from `/logs/stream`). A dropped connection is resumed
        after the last line seen (`Last-Event-ID`), `max_reconnects` times in a row."""
        call = calls.log_stream(job_id, rank=rank, tail=tail)
        cursor = LogCursor(max_reconnects=max_reconnects, backoff_s=backoff_s)
        while True:
            cause: Exception | None = None
            try:
                with connect_sse(
                    self._http,
                    call.method,
                    call.path,
                    params=call.params,
                    headers=cursor.headers(),
                    timeout=None,
                ) as source:
                    if source.response.is_error:
                        source.response.read()
                        raise api_error(source.response)
                    for event in source.iter_sse():
                        item = cursor.take(event)
                        if item is END:
                            return
                        if isinstance(item, LogLine):
                            yield item
            except httpx.TransportError as exc:
                cause = exc
            time.sleep(cursor.dropped(str(self._http.base_url), cause))

    def wait(
        self,
        job_id: int,
        timeout_s: float = 600.0,
        *,
        poll_s: float = 1.0,
        on_poll: Callable[[Job], object] | None = None,
    ) -> Job:
        """Block until the job ends. Raises `JobFailed` unless it SUCCEEDED, `WaitTimeout`
        after `timeout_s`. `on_poll` sees the job at every poll (a progress bar, say)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                job = self.get(job_id)
            except (Unavailable, TransportError):  # a blip: the job has not changed
                if time.monotonic() >= deadline:
                    raise
                time.sleep(poll_s)
                continue
            if on_poll is not None:
                on_poll(job)
            if has_ended(job, deadline, timeout_s):
                return job
            time.sleep(poll_s)

    def metric_points(
        self, job_id: int, names: Sequence[str] = ()
    ) -> builtins.list[ReportedValues]:
        """Every point the job reported (all pages), in order of arrival; with `names`,
        the points carrying one of them, with only those values."""
        points: list[ReportedValues] = []
        after: int | None = None
        while True:
            page = self.metric_page(job_id, names=names, after=after)
            points.extend(page.reported)
            if page.next_cursor is None:
                return points
            after = page.next_cursor

    def outputs(self, job_id: int, *, rank: int | None = None) -> builtins.list[OutputFile]:
        """Every file the job's ranks wrote to their OUTPUTS_DIR (all pages), sorted by
        path: each path once, from the lowest rank that has it, or rank `rank`'s."""
        files: list[OutputFile] = []
        cursor: str | None = None
        while True:
            page = self.outputs_page(job_id, rank=rank, cursor=cursor)
            files.extend(page.files)
            if page.next_cursor is None:
                return files
            cursor = page.next_cursor

    def download(
        self,
        job_id: int,
        path: str | None = None,
        to: str | Path = ".",
        *,
        rank: int | None = None,
    ) -> builtins.list[Path]:
        """Write the output `path` (None: every file `outputs` lists) under `to`,
        keeping relative paths, and return where each went. A path that would land
        outside `to` is refused before anything is written."""
        wanted = [(path, rank)] if path is not None else listed(self.outputs(job_id, rank=rank))
        targets = [(p, r, destination(to, p)) for p, r in wanted]
        return [self._save(calls.output_file(job_id, p, rank=r), dest) for p, r, dest in targets]

    def download_model(
        self, name: str, ref: str | int, to: str | Path = "."
    ) -> builtins.list[Path]:
        """Every file of version `ref` (a number or an alias) of model `name`, written
        under `to` at its relative path; each checked against its SHA-256 by the server
        before it is sent and here before it is renamed into place."""
        version = self.model_version(name, ref)
        written = []
        for f in version.files:
            call = calls.model_file(name, version.version, f.path)
            written.append(self._save(call, destination(to, f.path), sha256=f.sha256))
        return written

    def _save(self, call: Call[None], dest: Path, sha256: str | None = None) -> Path:
        """Stream the file `call` answers with into `dest` (see gangway.downloads)."""
        try:
            with self._http.stream(
                call.method, call.path, params=call.params, headers=call.headers
            ) as response:
                if response.is_error:
                    response.read()
                    raise api_error(response)
                with PartFile.open(dest, sha256) as part:
                    for chunk in response.iter_bytes():
                        part.write(chunk)
        except httpx.TransportError as exc:
            raise TransportError(f"cannot reach Gangway at {self._http.base_url}: {exc}") from exc
        return dest

    def send(self, call: Call[T]) -> T:
        """Send one described call; errors become the typed exceptions of gangway.errors."""
        try:
            response = self._http.request(
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


class Job(JobInfo):
    """A job as the service last described it (every `JobInfo` field), with the calls
    that act on it: `job.wait()`, `job.logs(follow=True)`, `job.explain()`, ... Calls that
    return the job return a fresh `Job`; this one does not change."""

    _client: Client = PrivateAttr()

    @classmethod
    def bind(cls, info: JobInfo, client: Client) -> Job:
        job = cls.model_validate(info, from_attributes=True)
        job._client = client
        return job

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

    def dependencies(self) -> JobDependencies:
        return self._client.dependencies(self.id)

    def events(self) -> list[JobEvent]:
        return self._client.events(self.id)

    def metrics(self, *, max_points: int = 500) -> list[MetricPoint]:
        return self._client.metrics(self.id, max_points=max_points)

    def metric_points(self, *names: str) -> list[ReportedValues]:
        """Every point the job reported (see `Client.metric_points`)."""
        return self._client.metric_points(self.id, names)

    def checkpoints(self) -> JobCheckpoints:
        return self._client.checkpoints(self.id)

    def outputs(self, rank: int | None = None) -> list[OutputFile]:
        """Every output file, sorted by path (see `Client.outputs`)."""
        return self._client.outputs(self.id, rank=rank)

    def download(
        self, path: str | None = None, to: str | Path = ".", rank: int | None = None
    ) -> list[Path]:
        """The output `path`, or every output file, written under `to` (see
        `Client.download`)."""
        return self._client.download(self.id, path, to, rank=rank)

    @overload
    def logs(
        self, *, rank: int | None = None, tail: int = 200, follow: Literal[False] = False
    ) -> list[LogLine]: ...

    @overload
    def logs(
        self, *, rank: int | None = None, tail: int = 200, follow: Literal[True]
    ) -> Iterator[LogLine]: ...

    def logs(
        self, *, rank: int | None = None, tail: int = 200, follow: bool = False
    ) -> list[LogLine] | Iterator[LogLine]:
        """The last `tail` lines; with `follow=True` an iterator that goes on yielding new
        lines until the job ends."""
        if follow:
            return self._client.follow_logs(self.id, rank=rank, tail=tail)
        return self._client.logs(self.id, rank=rank, tail=tail)


# -- shared by Client and AsyncClient ---------------------------------------------------


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def read_answer(call: Call[T], response: httpx.Response) -> T:
    if response.is_error:
        raise api_error(response)
    return call.read(response.json() if response.content else None)


def listed(files: list[OutputFile]) -> list[tuple[str, int | None]]:
    """What to download for a listing: each file from the very rank it was listed from."""
    return [(f.path, f.rank) for f in files]


def has_ended(job: JobInfo, deadline: float, timeout_s: float) -> bool:
    """One poll of `wait`: True once SUCCEEDED; raises once it ended otherwise, or when
    the time is up; False to poll again."""
    if job.state is JobState.SUCCEEDED:
        return True
    if job.state.is_terminal:
        raise JobFailed(job)
    if time.monotonic() >= deadline:
        raise WaitTimeout(f"job {job.id} still {job.state} after {timeout_s} s")
    return False


def api_error(response: httpx.Response) -> Exception:
    try:
        detail = response.json()["error"]
        code, message, field = detail["code"], detail["message"], detail.get("field")
    except (ValueError, KeyError, TypeError):
        code, message, field = "http_error", response.text[:500], None
    return error_for_status(response.status_code, code, message, field)
