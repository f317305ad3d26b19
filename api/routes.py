"""REST v1: jobs, events, logs, cluster, health. Handlers read and write the store only."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi import Path as PathParam

from api.auth import (
    Caller,
    Forbidden,
    Principal,
    current_caller,
    require_owner,
    require_queue_member,
    sees_env,
)
from api.convert import (
    cluster_info,
    job_checkpoints,
    job_dependencies,
    job_event,
    job_explanation,
    job_info,
    objective_value,
    prediction_accuracy,
    queue_infos,
)
from api.dependency_checks import checked_dependencies
from api.errors import FieldError
from api.estimate import Estimator
from api.limits import Limits
from api.model_refs import pinned_init_from
from api.pages import page_response
from api.validation import check_requirements, validate_submission
from gangway.models import (
    METRIC_NAME,
    Builtin,
    ClusterInfo,
    ErrorBody,
    Estimate,
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
    PredictionAccuracy,
    QueueInfo,
    ReportedValues,
    Script,
    submit_body,
)
from scheduler.model import RESOURCE_HOLDING_STATES, Node
from scheduler.store import JobRecord, JobRepository, NewJob, QueueRepository
from scheduler.store.packages import PackageStore
from scheduler.store.reported import MAX_PAGE
from scheduler.store.specs import spec_from_json

# Every /v1 route needs a caller (auth on) or lets everyone in (auth off): see api.auth.
router = APIRouter(dependencies=[Depends(current_caller)])
# Liveness stays open: load balancers and `scripts/serve` probe it without a key.
health_router = APIRouter()

ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "the body is not JSON"},
    401: {"model": ErrorBody, "description": "auth is on and the API key is missing or wrong"},
    403: {"model": ErrorBody, "description": "the caller's role does not allow this"},
    404: {"model": ErrorBody, "description": "no such job"},
    409: {
        "model": ErrorBody,
        "description": "the job's state does not allow this, or an Idempotency-Key reused",
    },
    413: {"model": ErrorBody, "description": "the body is over GANGWAY_MAX_BODY_BYTES"},
    422: {"model": ErrorBody, "description": "invalid input; `error.field` names the field"},
}


def repository(request: Request) -> JobRepository:
    repo: JobRepository = request.app.state.repo
    return repo


Repo = Annotated[JobRepository, Depends(repository)]

# Ids and ranks are SQL INTEGER columns (32-bit on PostgreSQL): larger numbers are a 422
# here, not a database error.
MAX_ID = 2**31 - 1
JobId = Annotated[int, PathParam(ge=1, le=MAX_ID, description="the job's id")]


def _node_names(repo: JobRepository) -> dict[str, str]:
    return {n.id: n.name for n in repo.nodes()}


def changed(request: Request) -> Callable[[], None]:
    """Tell the scheduler loop that its work changed (see `create_app`)."""
    on_change: Callable[[], None] = request.app.state.on_change
    return on_change


OnChange = Annotated[Callable[[], None], Depends(changed)]


@router.post("/v1/jobs", status_code=201, response_model=JobInfo, responses=ERROR_RESPONSES)
def submit_job(
    submit: JobSubmit,
    caller: Caller,
    *,
    repo: Repo,
    on_change: OnChange,
    request: Request,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            description="retry-safe submission: the same key returns the job it first made",
        ),
    ] = None,
) -> JobInfo:
    """Store the job. A retry (the same `Idempotency-Key`, the same body) gets the job the
    first request made, before any check: what changed since (an upstream job failed,
    the caller left the queue's members, a model alias moved) concerns new jobs only."""
    submit = admissible(submit, caller, request)
    nodes = repo.nodes()
    first = (
        repo.replayed(submit.user, idempotency_key, sent_digest(submit))
        if idempotency_key
        else None
    )
    if first is not None:
        record, created = first, False
    else:
        record, created = create_job(
            submit, caller, repo=repo, request=request, nodes=nodes, idempotency_key=idempotency_key
        )
    if created:
        on_change()
    else:
        response.headers["Idempotent-Replayed"] = "true"
    names = {n.id: n.name for n in nodes}
    return job_info(record, names, shows_env=sees_env(caller, record.user))


def create_job(
    submit: JobSubmit,
    caller: Principal,
    *,
    repo: JobRepository,
    request: Request,
    nodes: Sequence[Node],
    idempotency_key: str | None = None,
) -> tuple[JobRecord, bool]:
    """Check and store a job whose entrypoint the admins' policy has allowed (or which
    the service itself chose: a model export): the job, and whether it is new (an
    idempotent retry finds the first)."""
    new, reason = prepared_job(
        submit, caller, repo=repo, request=request, nodes=nodes, idempotency_key=idempotency_key
    )
    return repo.create_once(new, reason=reason)


def sent_digest(submit: JobSubmit) -> str:
    """Of the body as sent: a retry of an "auto" job matches even if the plan would
    differ; its secrets count too (other secrets are another job)."""
    sent = json.dumps(submit_body(submit), sort_keys=True)
    return hashlib.sha256(sent.encode()).hexdigest()


def prepared_job(
    submit: JobSubmit,
    caller: Principal,
    *,
    repo: JobRepository,
    request: Request,
    nodes: Sequence[Node],
    idempotency_key: str | None = None,
    steps: Mapping[str, int] | None = None,
) -> tuple[NewJob, str]:
    """Every check of a job to store, and the row to store with the first event's reason.
    `steps`: in a pipeline, the earlier steps by name (their place in it), which this one
    may wait for and start from."""
    digest = sent_digest(submit)
    require_queue_member(request.app.state.queue_store, submit.queue, submit.user)
    submit = pinned_init_from(submit, caller, request.app.state.registry)
    resolved = estimator(request).resolve(submit)
    submit = resolved.submit
    spec = submit_body(submit)  # stored with its secrets, which the ranks get
    job_spec = spec_from_json(spec)
    validate_submission(submit, job_spec, nodes)
    if isinstance(submit.entrypoint, Builtin):
        _refuse_sweep_fields(submit.entrypoint)
    depends_on = checked_dependencies(submit, caller, repo, steps)
    if submit.package is not None:
        _use_package(request.app.state.packages, submit.package)
    elif isinstance(submit.entrypoint, Script):  # ranks may start in another directory
        spec["entrypoint"]["path"] = str(Path(submit.entrypoint.path).resolve())
    new = NewJob(
        name=submit.name,
        queue=submit.queue,
        user=submit.user,
        priority=submit.priority,
        spec=spec,
        num_gpus=job_spec.shape.num_gpus,
        total_steps=getattr(submit.entrypoint, "steps", None),
        idempotency_key=idempotency_key,
        request_digest=digest,
        depends_on=depends_on,
    )
    chose = resolved.choice
    return new, f"submitted; parallelism auto chose {chose.reason}" if chose else "submitted"


def _refuse_sweep_fields(entry: Builtin) -> None:
    """`pause_at` and `pause_unless` are a sweep's: a job stopped there would wait, held,
    with nothing to release it."""
    for name in ("pause_at", "pause_unless"):
        if getattr(entry, name):
            raise FieldError(
                f"entrypoint.{name}",
                "set only by a sweep's early stopping: a job stopped there would wait, "
                "held, with nothing to release it",
            )


def estimator(request: Request) -> Estimator:
    found: Estimator = request.app.state.estimator
    return found


@router.post("/v1/estimate", response_model=Estimate, responses=ERROR_RESPONSES)
def estimate_job(submit: JobSubmit, caller: Caller, request: Request) -> Estimate:
    """What the job would get if submitted now: predicted step time (built-in trainer),
    run time, earliest start on this cluster; with `"parallelism": "auto"` the plan."""
    submit = admissible(submit, caller, request)
    require_queue_member(request.app.state.queue_store, submit.queue, submit.user)
    return estimator(request).estimate(submit, request.app.state.queue_store.quotas())


@router.get(
    "/v1/predictions/accuracy", response_model=PredictionAccuracy, responses=ERROR_RESPONSES
)
def get_prediction_accuracy(repo: Repo) -> PredictionAccuracy:
    """How good run-time predictions have been on this cluster's succeeded jobs."""
    return prediction_accuracy(repo.accuracy_pairs())


def _use_package(packages: PackageStore, sha256: str) -> None:
    if packages.get(sha256) is None:
        raise FieldError(
            "package",
            f"working directory {sha256} was not uploaded: PUT /v1/packages/{sha256} first "
            "(the SDK and `gangway submit --workdir` do this)",
        )
    packages.touch(sha256)


def who(caller: Principal, request: Request) -> str:
    """Who to name in a job's timeline: the key's user with auth on; "user" without it,
    where every caller is the same anonymous admin."""
    return caller.name if request.app.state.auth.required else "user"


def admissible(submit: JobSubmit, caller: Principal, request: Request) -> JobSubmit:
    """What submit and estimate check first: whose job it is, the admins' policy on
    entrypoints, and the requirement lines pip would get."""
    submit = _on_behalf_of(submit, caller, request.app.state.auth.required)
    request.app.state.submit_policy.check(submit, caller)
    limits: Limits = request.app.state.limits
    check_requirements(submit.requirements, allow_pip_options=limits.requirements_allow_pip_options)
    return submit


def _on_behalf_of(submit: JobSubmit, caller: Principal, auth_required: bool) -> JobSubmit:
    """With auth, a job counts against the key's user; an admin may name someone else."""
    if not auth_required:
        return submit
    if "user" not in submit.model_fields_set:
        return submit.model_copy(update={"user": caller.name})
    if submit.user != caller.name and not caller.is_admin:
        raise Forbidden(f"{caller.name} may not submit as {submit.user}", field="user")
    return submit


@router.get("/v1/jobs", response_model=JobPage, responses=ERROR_RESPONSES)
def list_jobs(
    repo: Repo,
    request: Request,
    caller: Caller,
    *,
    state: Annotated[list[JobState] | None, Query(description="filter; repeat for several")] = None,
    queue: Annotated[str | None, Query(max_length=100, description="only this queue")] = None,
    user: Annotated[str | None, Query(max_length=100, description="only this user's")] = None,
    name_prefix: Annotated[
        str | None, Query(max_length=200, description="names starting with this")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="next_cursor of the previous page")
    ] = None,
) -> Response:
    """Newest first. A page also ends early (with a `next_cursor`) once it holds
    GANGWAY_MAX_PAGE_BYTES of JSON, so no `limit` makes a response unboundedly large."""
    records = repo.page(
        states=state or (),
        queue=queue,
        user=user,
        name_prefix=name_prefix,
        limit=limit + 1,
        before_id=cursor,
    )
    names = _node_names(repo)
    shown = records[:limit]
    predicted = repo.predictions(r.id for r in shown)
    best = repo.objectives(r.id for r in shown)
    items = (
        job_info(
            r,
            names,
            predicted.get(r.id),
            shows_env=sees_env(caller, r.user),
            objective=best.get(r.id),
        )
        for r in shown
    )
    budget: int = request.app.state.limits.max_page_bytes
    return page_response(items, more=len(records) > limit, max_bytes=budget)


@router.get("/v1/jobs/{job_id}", response_model=JobInfo, responses=ERROR_RESPONSES)
def get_job(job_id: JobId, caller: Caller, repo: Repo) -> JobInfo:
    """The job as submitted (env values only for its owner and admins, secrets never),
    its state, placement and progress."""
    record = repo.get(job_id)
    predicted = repo.predictions([job_id]).get(job_id)
    return job_info(
        record,
        _node_names(repo),
        predicted,
        shows_env=sees_env(caller, record.user),
        objective=repo.objectives([job_id]).get(job_id),
    )


@router.post("/v1/jobs/{job_id}/cancel", response_model=JobInfo, responses=ERROR_RESPONSES)
def cancel_job(
    job_id: JobId, caller: Caller, request: Request, repo: Repo, on_change: OnChange
) -> JobInfo:
    """Cancel now in the store; the scheduler loop stops the ranks on its next pass.

    Cancelling a job that already ended is a 409 (its outcome is kept, not overwritten).
    """
    require_owner(caller, repo.get(job_id).user, f"job {job_id}")
    reason = f"cancelled by {who(caller, request)}"
    record = repo.transition(job_id, JobState.CANCELLED, reason=reason)
    on_change()
    return job_info(record, _node_names(repo), shows_env=sees_env(caller, record.user))


@router.patch("/v1/jobs/{job_id}", response_model=JobInfo, responses=ERROR_RESPONSES)
def change_job(
    job_id: JobId,
    patch: JobPatch,
    caller: Caller,
    *,
    request: Request,
    repo: Repo,
    on_change: OnChange,
) -> JobInfo:
    """Change a job's priority: a pending job moves in the queue on the next pass; a
    running one is ranked by it for preemption. A job that ended is a 409."""
    before = repo.get(job_id)
    require_owner(caller, before.user, f"job {job_id}")
    reason = f"priority changed from {before.priority} to {patch.priority}"
    if request.app.state.auth.required:
        reason += f" by {caller.name}"
    record = repo.annotate(job_id, reason, priority=patch.priority)
    on_change()
    return job_info(record, _node_names(repo), shows_env=sees_env(caller, record.user))


@router.get("/v1/jobs/{job_id}/explain", response_model=JobExplanation, responses=ERROR_RESPONSES)
def explain_job(job_id: JobId, repo: Repo) -> JobExplanation:
    """Why the job is in its state; for a pending job the blocking constraint, what would
    unblock it, its queue position and estimated start, as of the latest scheduling pass."""
    return job_explanation(repo.get(job_id), repo.now(), repo.links(job_id))


@router.get(
    "/v1/jobs/{job_id}/dependencies", response_model=JobDependencies, responses=ERROR_RESPONSES
)
def get_dependencies(job_id: JobId, repo: Repo) -> JobDependencies:
    """The jobs this one waits (or waited) for, and the jobs that wait for it, each with
    the condition and whether it still waits or was met (when)."""
    repo.get(job_id)  # 404 for an unknown job
    return job_dependencies(repo.links(job_id))


@router.get("/v1/jobs/{job_id}/events", response_model=list[JobEvent], responses=ERROR_RESPONSES)
def job_events(job_id: JobId, repo: Repo) -> list[JobEvent]:
    return [job_event(e) for e in repo.events(job_id)]


@router.get("/v1/jobs/{job_id}/logs", response_model=JobLogs, responses=ERROR_RESPONSES)
def job_logs(
    job_id: JobId,
    repo: Repo,
    rank: Annotated[int | None, Query(ge=0, le=MAX_ID, description="one rank only")] = None,
    tail: Annotated[
        int, Query(ge=1, le=10_000, description="the last N lines, or N lines after `after`")
    ] = 200,
    after: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="a line's id: read on after it")
    ] = None,
) -> JobLogs:
    """What the ranks printed, every attempt, oldest first; kept after the job ends.
    For a live view, `/logs/stream` pushes new lines as they arrive."""
    lines = repo.logs(job_id, rank=rank, tail=tail, after=after)
    return JobLogs(lines=[LogLine(**asdict(line)) for line in lines])


@router.get("/v1/jobs/{job_id}/metrics", response_model=JobMetrics, responses=ERROR_RESPONSES)
def job_metrics(
    job_id: JobId,
    repo: Repo,
    *,
    max_points: Annotated[
        int, Query(ge=2, le=10_000, description="thin the samples to at most this many")
    ] = 500,
    name: Annotated[
        list[Annotated[str, Query(pattern=METRIC_NAME)]],
        Query(max_length=64, description="only reported points carrying one of these"),
    ] = [],  # noqa: B006 (FastAPI copies a query list's default)
    after: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="a reported point's id: read on")
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE, description="reported points read in this page")
    ] = MAX_PAGE,
) -> JobMetrics:
    """What the job reported (every point, any name, every attempt: a page at a time),
    the names it has reported, its objective's best value, and the service's samples of
    loss, tokens/s, step time and memory."""
    reported, next_cursor = repo.reported_points(job_id, names=name, after=after, limit=limit)
    samples = repo.metrics(job_id, max_points=max_points)
    best = repo.objectives([job_id]).get(job_id)
    return JobMetrics(
        points=[MetricPoint(**asdict(point)) for point in samples],
        names=repo.metric_names(job_id),
        reported=[ReportedValues(**asdict(point)) for point in reported],
        next_cursor=next_cursor,
        objective=objective_value(best) if best is not None else None,
    )


@router.get(
    "/v1/jobs/{job_id}/checkpoints", response_model=JobCheckpoints, responses=ERROR_RESPONSES
)
def list_checkpoints(job_id: JobId, repo: Repo, request: Request) -> JobCheckpoints:
    """The job's complete checkpoints (the one it resumes from is the last)."""
    repo.get(job_id)  # 404 for an unknown job
    root: Path | None = request.app.state.checkpoint_root
    return job_checkpoints(root, job_id, request.app.state.checkpoint_store)


@router.get("/v1/queues", response_model=list[QueueInfo], responses=ERROR_RESPONSES)
def list_queues(repo: Repo, request: Request) -> list[QueueInfo]:
    """Configured queues (by admins, or seeded from GANGWAY_QUEUES) and any queue a job
    names: guarantee, borrowing limit, GPUs in use and borrowed now, jobs pending and
    holding GPUs, members."""
    return queues_now(request.app.state.queue_store, repo)


def queues_now(store: QueueRepository, repo: JobRepository, also: str = "") -> list[QueueInfo]:
    """Each queue as GET /v1/queues shows it, from the rows as they are now (and queue
    `also`, even with no quota, members or jobs)."""
    return queue_infos(
        store.quotas(),
        store.members(),
        repo.in_states(RESOURCE_HOLDING_STATES),
        repo.count_jobs(),
        also=also,
    )


@router.get("/v1/cluster", response_model=ClusterInfo, responses=ERROR_RESPONSES)
def get_cluster(repo: Repo) -> ClusterInfo:
    return cluster_info(repo.nodes(), repo.in_states(RESOURCE_HOLDING_STATES))


@health_router.get("/healthz")
def healthz(repo: Repo) -> dict[str, str]:
    repo.nodes()  # proves the database answers
    return {"status": "ok"}
