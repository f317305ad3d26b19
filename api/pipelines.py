"""REST v1 for pipelines: several jobs submitted at once, all or none, as named steps that
wait for and start from the steps before them (see `scheduler.store.pipelines`).

Each step gets every check a single submit gets (`routes.prepared_job`: the admins'
policy, the plan, what it may name); a refusal names the step's field
(`jobs.2.depends_on.0.job`) and stores nothing. Cancelling a pipeline cancels every step
that has not ended; the loop stops the running ones as it does for a single cancel.
"""

from __future__ import annotations

import contextlib
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam

from api.auth import Caller, Forbidden, Principal, current_caller, require_owner, sees_env
from api.convert import job_info
from api.errors import FieldError
from api.routes import (
    ERROR_RESPONSES,
    MAX_ID,
    OnChange,
    Repo,
    admissible,
    prepared_job,
    who,
)
from gangway.models import JobState, PipelineInfo, PipelineSubmit
from scheduler.model import RESOURCE_HOLDING_STATES
from scheduler.store import IllegalTransition, JobRepository, NewJob, StaleState
from scheduler.store.pipelines import PipelineRecord

router = APIRouter(dependencies=[Depends(current_caller)])

PipelineId = Annotated[int, PathParam(ge=1, le=MAX_ID, description="the pipeline's id")]


@router.post(
    "/v1/pipelines", status_code=201, response_model=PipelineInfo, responses=ERROR_RESPONSES
)
def submit_pipeline(
    submit: PipelineSubmit, caller: Caller, *, repo: Repo, request: Request, on_change: OnChange
) -> PipelineInfo:
    """Store every step, or none: one refused step refuses the pipeline (a 422 naming it)."""
    nodes = repo.nodes()
    steps: dict[str, int] = {}
    prepared: list[NewJob] = []
    for index, step in enumerate(submit.jobs):
        try:
            job = admissible(step, caller, request)
            new, _ = prepared_job(job, caller, repo=repo, request=request, nodes=nodes, steps=steps)
        except FieldError as exc:
            raise FieldError(f"jobs.{index}.{exc.field}", exc.message) from exc
        except Forbidden as exc:
            field = f"jobs.{index}.{exc.field}" if exc.field else f"jobs.{index}"
            raise Forbidden(str(exc), field=field) from exc
        if prepared and new.user != prepared[0].user:
            raise FieldError(f"jobs.{index}.user", "every step of a pipeline is one user's")
        prepared.append(new)
        steps[step.name] = index
    record = repo.create_pipeline(submit.name, prepared[0].user, prepared)
    on_change()
    return _info(record, repo, caller)


@router.get("/v1/pipelines/{pipeline_id}", response_model=PipelineInfo, responses=ERROR_RESPONSES)
def get_pipeline(pipeline_id: PipelineId, caller: Caller, repo: Repo) -> PipelineInfo:
    """The pipeline's steps as jobs, and its state as theirs add up."""
    return _info(repo.pipeline(pipeline_id), repo, caller)


@router.post(
    "/v1/pipelines/{pipeline_id}/cancel", response_model=PipelineInfo, responses=ERROR_RESPONSES
)
def cancel_pipeline(
    pipeline_id: PipelineId, caller: Caller, *, repo: Repo, request: Request, on_change: OnChange
) -> PipelineInfo:
    """Cancel every step that has not ended; those that ended keep their outcome."""
    record = repo.pipeline(pipeline_id)
    require_owner(caller, record.user, f"pipeline {pipeline_id}")
    reason = f"cancelled with pipeline {pipeline_id} by {who(caller, request)}"
    for job in record.jobs:
        if not job.state.is_terminal:
            _cancel(repo, job.id, reason)
    on_change()
    return _info(repo.pipeline(pipeline_id), repo, caller)


def _cancel(repo: JobRepository, job_id: int, reason: str) -> None:
    """A step that ended meanwhile (the loop moved it) keeps its outcome."""
    with contextlib.suppress(IllegalTransition, StaleState):
        repo.transition(job_id, JobState.CANCELLED, reason=reason)


def _info(record: PipelineRecord, repo: JobRepository, caller: Principal) -> PipelineInfo:
    names = {n.id: n.name for n in repo.nodes()}
    return PipelineInfo(
        id=record.id,
        name=record.name,
        user=record.user,
        submitted_at=record.submitted_at,
        state=pipeline_state([job.state for job in record.jobs]),
        jobs=[job_info(j, names, shows_env=sees_env(caller, j.user)) for j in record.jobs],
    )


def pipeline_state(states: list[JobState]) -> JobState:
    """RUNNING while a step holds GPUs, PENDING while the rest only wait; once all ended,
    SUCCEEDED if all did, else FAILED if one failed, else CANCELLED."""
    if any(s in RESOURCE_HOLDING_STATES for s in states):
        return JobState.RUNNING
    if any(not s.is_terminal for s in states):
        return JobState.PENDING
    if all(s is JobState.SUCCEEDED for s in states):
        return JobState.SUCCEEDED
    return JobState.FAILED if JobState.FAILED in states else JobState.CANCELLED
