"""Every REST call the SDK makes, as data: method, path, query, body and how to read the
answer. `Client` sends them with httpx's blocking client, `AsyncClient` with its async
one; neither knows a path. One place to change when the API changes, and the two clients
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, TypeAdapter, ValidationError

from gangway.errors import error_for_status, validation_failed
from gangway.models import (
    AliasSet,
    ApiKeyInfo,
    ClusterInfo,
    Estimate,
    IssuedApiKey,
    JobCheckpoints,
    JobDependencies,
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
    ModelExport,
    ModelInfo,
    ModelList,
    ModelRegister,
    ModelVersionInfo,
    OutputsPage,
    PackageInfo,
    PipelineInfo,
    PipelineSubmit,
    PredictionAccuracy,
    QueueInfo,
    QueueMembers,
    QueueSpec,
    ReadersSet,
    Role,
    SweepInfo,
    SweepSubmit,
    UserCreate,
    UserInfo,
    WhoAmI,
    submit_body,
    wire_default,
)
from gangway.paths import BadPath, path_parts

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the reader of its JSON answer (`None` for a 204)."""

    method: str
    path: str
    read: Callable[[Any], T]
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None  # a raw body (a package upload) instead of `json`


def _reader(model: type[T]) -> Callable[[Any], T]:
    return TypeAdapter(model).validate_python


def _no_body(_: Any) -> None:
    return None


M = TypeVar("M", bound=BaseModel)


def _checked(model: type[M], **fields: Any) -> M:
    """Check arguments here, raising the `ValidationFailed` (422, naming the field) the
    server would, without a request."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise validation_failed(exc) from exc


def _optional(**params: Any) -> dict[str, Any]:
    return {name: value for name, value in params.items() if value is not None}


# -- jobs -----------------------------------------------------------------------------


def submit(
    spec: JobSubmit | None = None,
    *,
    idempotency_key: str | None = None,
    package: str | None = None,
    **fields: Any,
) -> Call[JobInfo]:
    """Submit a job: `submit(JobSubmit(...))` or `submit(name=..., entrypoint=Builtin())`.

    With an `idempotency_key` a submission is safe to retry (after a `TransportError`,
    say): the same key returns the job the first attempt made, never a second one.
    Without a `user`, the job is the API key's user's. `secrets={"NAME": "value"}` are
    variables for the ranks that no response ever shows (the job lists their names)."""
    if spec is None:
        spec = _checked(JobSubmit, **fields, **_optional(package=package))
    elif package is not None:
        spec = spec.model_copy(update={"package": package})
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call("POST", "/v1/jobs", _reader(JobInfo), json=_sent_body(spec), headers=headers)


def _sent_body(spec: JobSubmit) -> dict[str, Any]:
    body = submit_body(spec)  # with its secrets: the one place they travel
    if "user" not in spec.model_fields_set:
        del body["user"]  # the server fills in the caller
    return body


# -- pipelines ------------------------------------------------------------------------


def submit_pipeline(spec: PipelineSubmit | None = None, **fields: Any) -> Call[PipelineInfo]:
    """Submit several jobs at once, all or none: `submit_pipeline(PipelineSubmit(...))` or
    `submit_pipeline(name=..., jobs=[...])`; a step names earlier steps by their job names
    in `depends_on` and `init_from` (`{"job": "pretrain"}`)."""
    if spec is None:
        spec = _checked(PipelineSubmit, **fields)
    body = {"name": spec.name, "jobs": [_sent_body(job) for job in spec.jobs]}
    return Call("POST", "/v1/pipelines", _reader(PipelineInfo), json=body)


def pipeline(pipeline_id: int) -> Call[PipelineInfo]:
    """The pipeline's steps as jobs and its state as theirs add up."""
    return Call("GET", f"/v1/pipelines/{pipeline_id}", _reader(PipelineInfo))


def cancel_pipeline(pipeline_id: int) -> Call[PipelineInfo]:
    """Cancel every step that has not ended."""
    return Call("POST", f"/v1/pipelines/{pipeline_id}/cancel", _reader(PipelineInfo))


# -- sweeps ---------------------------------------------------------------------------


def submit_sweep(spec: SweepSubmit | None = None, **fields: Any) -> Call[SweepInfo]:
    """Start a search: `submit_sweep(SweepSubmit(...))` or the same fields (`name`,
    `base`, `space`, `searcher`, `early_stopping`, `max_trials`, ...)."""
    if spec is None:
        spec = _checked(SweepSubmit, **fields)
    body = {**spec.model_dump(mode="json", exclude={"base"}), "base": _sent_body(spec.base)}
    return Call("POST", "/v1/sweeps", _reader(SweepInfo), json=body)


def sweep(sweep_id: int) -> Call[SweepInfo]:
    """The sweep's trials (parameters, objective per rung, state, GPU-seconds) and best."""
    return Call("GET", f"/v1/sweeps/{sweep_id}", _reader(SweepInfo))


def cancel_sweep(sweep_id: int) -> Call[SweepInfo]:
    """End the sweep and cancel every trial that has not ended."""
    return Call("POST", f"/v1/sweeps/{sweep_id}/cancel", _reader(SweepInfo))


def estimate(spec: JobSubmit | None = None, **fields: Any) -> Call[Estimate]:
    """What a job would get if submitted now: `estimate(JobSubmit(...))` or the same
    fields as `submit`; `parallelism="auto"` (with `gpu_budget`) asks for a plan."""
    if spec is None:
        spec = _checked(JobSubmit, **fields)
    body = spec.model_dump(mode="json")
    if "user" not in spec.model_fields_set:
        del body["user"]
    return Call("POST", "/v1/estimate", _reader(Estimate), json=body)


def prediction_accuracy() -> Call[PredictionAccuracy]:
    return Call("GET", "/v1/predictions/accuracy", _reader(PredictionAccuracy))


def package(sha256: str) -> Call[PackageInfo]:
    """An uploaded working directory, by the sha256 of its zip (NotFound: not uploaded)."""
    return Call("GET", f"/v1/packages/{sha256}", _reader(PackageInfo))


def upload_package(sha256: str, data: bytes) -> Call[PackageInfo]:
    """Upload a working directory's zip (`gangway.packaging.pack`) under its sha256."""
    headers = {"Content-Type": "application/zip"}
    return Call(
        "PUT", f"/v1/packages/{sha256}", _reader(PackageInfo), headers=headers, content=data
    )


def get(job_id: int) -> Call[JobInfo]:
    return Call("GET", f"/v1/jobs/{job_id}", _reader(JobInfo))


def list_jobs(
    *,
    state: JobState | str | Sequence[JobState | str] | None = None,
    queue: str | None = None,
    user: str | None = None,
    name_prefix: str | None = None,
    limit: int = 50,
    cursor: int | None = None,
) -> Call[JobPage]:
    """Newest first; pass `cursor=page.next_cursor` for the next page."""
    states = [state] if isinstance(state, str) else list(state or ())
    params = _optional(queue=queue, user=user, name_prefix=name_prefix, cursor=cursor)
    params["limit"] = limit
    if states:
        params["state"] = [str(s) for s in states]
    return Call("GET", "/v1/jobs", _reader(JobPage), params=params)


def set_priority(job_id: int, priority: int) -> Call[JobInfo]:
    """Reorder a pending job, or re-rank a running one for preemption."""
    body = _checked(JobPatch, priority=priority).model_dump()
    return Call("PATCH", f"/v1/jobs/{job_id}", _reader(JobInfo), json=body)


def cancel(job_id: int) -> Call[JobInfo]:
    return Call("POST", f"/v1/jobs/{job_id}/cancel", _reader(JobInfo))


def explain(job_id: int) -> Call[JobExplanation]:
    """Why the job is where it is; for a pending one: blocker, queue position, ETA."""
    return Call("GET", f"/v1/jobs/{job_id}/explain", _reader(JobExplanation))


def dependencies(job_id: int) -> Call[JobDependencies]:
    """The jobs it waits (or waited) for and the jobs that wait for it."""
    return Call("GET", f"/v1/jobs/{job_id}/dependencies", _reader(JobDependencies))


def events(job_id: int) -> Call[list[JobEvent]]:
    """Every state change with its reason, oldest first."""
    return Call("GET", f"/v1/jobs/{job_id}/events", _reader(list[JobEvent]))


def _lines(answer: Any) -> list[LogLine]:
    return JobLogs.model_validate(answer).lines


def logs(
    job_id: int, *, rank: int | None = None, tail: int = 200, after: int | None = None
) -> Call[list[LogLine]]:
    """The last `tail` lines the job's ranks printed (all attempts), oldest first; with
    `after` (a line's `id`), up to `tail` lines that came after it, to poll for new ones."""
    params = _optional(rank=rank, tail=tail, after=after)
    return Call("GET", f"/v1/jobs/{job_id}/logs", _lines, params=params)


def log_stream(job_id: int, *, rank: int | None = None, tail: int = 200) -> Call[None]:
    """The Server-Sent Events stream behind `follow_logs` (read line by line, not as JSON)."""
    params = _optional(rank=rank, tail=tail)
    return Call("GET", f"/v1/jobs/{job_id}/logs/stream", _no_body, params=params)


def _points(answer: Any) -> list[MetricPoint]:
    return JobMetrics.model_validate(answer).points


def metrics(job_id: int, *, max_points: int = 500) -> Call[list[MetricPoint]]:
    """The service's samples of loss, tokens/s, step time and memory over steps, thinned
    to `max_points` (what the job itself reported: `metric_page`)."""
    params = {"max_points": max_points}
    return Call("GET", f"/v1/jobs/{job_id}/metrics", _points, params=params)


def metric_page(
    job_id: int, *, names: Sequence[str] = (), after: int | None = None, limit: int = 10_000
) -> Call[JobMetrics]:
    """A page of what the job reported (see `JobMetrics.reported`), its names and its
    objective's best value; with `names`, only the points carrying one of them."""
    params = _optional(name=list(names) or None, after=after, limit=limit, max_points=2)
    return Call("GET", f"/v1/jobs/{job_id}/metrics", _reader(JobMetrics), params=params)


def checkpoints(job_id: int) -> Call[JobCheckpoints]:
    """The job's complete checkpoints, oldest first (it resumes from the last)."""
    return Call("GET", f"/v1/jobs/{job_id}/checkpoints", _reader(JobCheckpoints))


def outputs(
    job_id: int, *, rank: int | None = None, cursor: str | None = None, limit: int = 1000
) -> Call[OutputsPage]:
    """One page of the files the job's ranks wrote to their OUTPUTS_DIR, sorted by path:
    each path once, from the lowest rank that has it, or rank `rank`'s; pass
    `cursor=page.next_cursor` for the next. The first page also says how much of their
    quota the job's owner uses."""
    params = _optional(rank=rank, cursor=cursor)
    params["limit"] = limit
    return Call("GET", f"/v1/jobs/{job_id}/outputs", _reader(OutputsPage), params=params)


def output_file(job_id: int, path: str, *, rank: int | None = None) -> Call[None]:
    """One output file's bytes (the lowest rank's copy, or rank `rank`'s): streamed to a
    file by the client, not read as JSON. A path that can never name an output (absolute,
    with '..') is refused here, as the server would (`ValidationFailed` naming `path`)."""
    relative_path(path)
    return Call(
        "GET",
        f"/v1/jobs/{job_id}/outputs/{quote(path, safe='/')}",
        _no_body,
        params=_optional(rank=rank),
    )


def relative_path(path: str) -> tuple[str, ...]:
    """`path`'s components, or the 422 naming `path` the server would answer."""
    try:
        return path_parts(path)
    except BadPath as exc:
        raise error_for_status(422, "validation_error", str(exc), "path") from exc


# -- cluster and queues ---------------------------------------------------------------


def cluster() -> Call[ClusterInfo]:
    """Every node: GPUs total, allocated and free, health, and which jobs hold them."""
    return Call("GET", "/v1/cluster", _reader(ClusterInfo))


def queues() -> Call[list[QueueInfo]]:
    """Each queue's guarantee and borrowing limit, GPUs in use and borrowed now."""
    return Call("GET", "/v1/queues", _reader(list[QueueInfo]))


def set_queue(
    name: str,
    *,
    guaranteed_gpus: int = wire_default(QueueSpec, "guaranteed_gpus"),
    borrow_limit_gpus: int | None = wire_default(QueueSpec, "borrow_limit_gpus"),
    weight: float = wire_default(QueueSpec, "weight"),
) -> Call[QueueInfo]:
    """Create or change a queue's quota (admins); applied on the scheduler's next pass."""
    body = _checked(
        QueueSpec,
        guaranteed_gpus=guaranteed_gpus,
        borrow_limit_gpus=borrow_limit_gpus,
        weight=weight,
    )
    return Call("PUT", f"/v1/queues/{name}", _reader(QueueInfo), json=body.model_dump())


def set_queue_members(name: str, members: Sequence[str]) -> Call[QueueInfo]:
    """Who the queue is for (admins): only they (and admins) submit to it, and they read
    the models shared with `queue:<name>`. No members: every user."""
    body = _checked(QueueMembers, members=list(members))
    return Call("PUT", f"/v1/queues/{name}/members", _reader(QueueInfo), json=body.model_dump())


def delete_queue(name: str) -> Call[None]:
    """Forget a queue's quota (admins); its jobs stay, with no guarantee and no limit."""
    return Call("DELETE", f"/v1/queues/{name}", _no_body)


def calibrate() -> Call[list[JobInfo]]:
    """Queue calibration runs for the most common node type (admins): short built-in jobs
    whose measured step times fit the step-time model estimates and "auto" use."""
    return Call("POST", "/v1/calibrations", _reader(list[JobInfo]))


# -- users and keys -------------------------------------------------------------------


def whoami() -> Call[WhoAmI]:
    return Call("GET", "/v1/whoami", _reader(WhoAmI))


def users() -> Call[list[UserInfo]]:
    return Call("GET", "/v1/users", _reader(list[UserInfo]))


def create_user(name: str, *, role: Role = "user") -> Call[UserInfo]:
    """A new user (admins); then `issue_key(name)` gives them a key."""
    body = _checked(UserCreate, name=name, role=role).model_dump()
    return Call("POST", "/v1/users", _reader(UserInfo), json=body)


def issue_key(user: str) -> Call[IssuedApiKey]:
    """A new API key for `user` (admins, or the user themself); its secret is only here."""
    return Call("POST", f"/v1/users/{user}/keys", _reader(IssuedApiKey))


def keys(user: str) -> Call[list[ApiKeyInfo]]:
    return Call("GET", f"/v1/users/{user}/keys", _reader(list[ApiKeyInfo]))


def revoke_key(key_id: int) -> Call[ApiKeyInfo]:
    """The key stops working at once (admins, or its user)."""
    return Call("POST", f"/v1/keys/{key_id}/revoke", _reader(ApiKeyInfo))


# -- the model registry ---------------------------------------------------------------


def register_model(
    name: str, job_id: int, *, step: int | None = None, readers: Sequence[str] = ()
) -> Call[ModelVersionInfo]:
    """The next version of model `name` from job `job_id`'s checkpoint (its newest, or
    the one at `step`); a new model is the caller's, readable by `readers` too."""
    body = _checked(ModelRegister, name=name, job_id=job_id, step=step, readers=list(readers))
    return Call("POST", "/v1/models", _reader(ModelVersionInfo), json=body.model_dump())


def _models(answer: Any) -> list[ModelInfo]:
    return ModelList.model_validate(answer).models


def models() -> Call[list[ModelInfo]]:
    """The models the caller may read (without their versions)."""
    return Call("GET", "/v1/models", _models)


def model(name: str) -> Call[ModelInfo]:
    """A model with every version (lineage, metrics, file digests) and its aliases."""
    return Call("GET", f"/v1/models/{quote(name, safe='')}", _reader(ModelInfo))


def model_version(name: str, ref: str | int) -> Call[ModelVersionInfo]:
    """Version `ref` (a number or an alias) of model `name`."""
    path = f"/v1/models/{quote(name, safe='')}/versions/{quote(str(ref), safe='')}"
    return Call("GET", path, _reader(ModelVersionInfo))


def set_alias(name: str, alias: str, version: int) -> Call[ModelInfo]:
    """Point `alias` at `version` (the model's owner or an admin)."""
    path = f"/v1/models/{quote(name, safe='')}/aliases/{quote(alias, safe='')}"
    body = _checked(AliasSet, version=version).model_dump()
    return Call("PUT", path, _reader(ModelInfo), json=body)


def remove_alias(name: str, alias: str) -> Call[None]:
    path = f"/v1/models/{quote(name, safe='')}/aliases/{quote(alias, safe='')}"
    return Call("DELETE", path, _no_body)


def set_model_readers(name: str, readers: Sequence[str]) -> Call[ModelInfo]:
    """Who besides the owner (and admins) may read the model (the owner or an admin)."""
    body = _checked(ReadersSet, readers=list(readers)).model_dump()
    return Call("PUT", f"/v1/models/{quote(name, safe='')}/readers", _reader(ModelInfo), json=body)


def delete_model_version(name: str, version: int) -> Call[None]:
    path = f"/v1/models/{quote(name, safe='')}/versions/{version}"
    return Call("DELETE", path, _no_body)


def model_file(name: str, version: int, path: str) -> Call[None]:
    """One file of a version, streamed to disk by the client and checked there too."""
    relative_path(path)
    return Call(
        "GET",
        f"/v1/models/{quote(name, safe='')}/versions/{version}/files/{quote(path, safe='/')}",
        _no_body,
    )


def export_model(
    name: str,
    ref: str | int,
    *,
    quantize: str = "none",
    eval_batches: int = 4,
    queue: str = wire_default(ModelExport, "queue"),
) -> Call[JobInfo]:
    """Submit the job that exports version `ref` of `name` to safetensors (its outputs),
    waiting in `queue`."""
    body = _checked(
        ModelExport, quantize=quantize, eval_batches=eval_batches, queue=queue
    ).model_dump()
    path = f"/v1/models/{quote(name, safe='')}/versions/{quote(str(ref), safe='')}/export"
    return Call("POST", path, _reader(JobInfo), json=body)
