"""REST v1 for sweeps: a search over a job's fields whose trials are ordinary jobs, run by
the scheduler loop's sweep controller (`scheduler.runtime.sweeps`).

A submit checks what every trial could be before anything is stored: the base job gets
every check a job gets (`routes.prepared_job`), and so does the base with each dimension
at each end of its range (each value of a choice), so a trial the controller makes later
passes the checks its corners passed; a path the base job has no field at is a 422 naming
`space.<path>`.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from pydantic import ValidationError

from api.auth import Caller, current_caller, require_owner
from api.errors import FieldError
from api.routes import ERROR_RESPONSES, MAX_ID, OnChange, Repo, admissible, prepared_job, who
from gangway.models import (
    Choice,
    Dimension,
    IntRange,
    JobState,
    JobSubmit,
    Objective,
    SweepBest,
    SweepInfo,
    SweepSubmit,
    SweepTrialInfo,
    submit_body,
)
from scheduler.core.asha import TrialState
from scheduler.runtime.sweeps import rungs_of, set_path, sweep_plan
from scheduler.store import IllegalTransition, JobRecord, JobRepository, StaleState
from scheduler.store.sweeps import SweepRecord, SweepState

router = APIRouter(dependencies=[Depends(current_caller)])

SweepId = Annotated[int, PathParam(ge=1, le=MAX_ID, description="the sweep's id")]


@router.post("/v1/sweeps", status_code=201, response_model=SweepInfo, responses=ERROR_RESPONSES)
def submit_sweep(
    submit: SweepSubmit, caller: Caller, *, repo: Repo, request: Request, on_change: OnChange
) -> SweepInfo:
    """Store the sweep; its trials are made by the scheduler loop, pass by pass."""
    base = admissible(submit.base, caller, request)
    nodes = repo.nodes()
    for field, body in _corners(submit, base):
        try:
            job = JobSubmit.model_validate(body)
            prepared_job(job, caller, repo=repo, request=request, nodes=nodes)
        except ValidationError as exc:
            raise FieldError(field, str(exc.errors()[0]["msg"])) from exc
        except FieldError as exc:
            raise FieldError(field, f"{exc.field}: {exc.message}") from exc
    try:
        rungs_of(submit)
    except ValueError as exc:
        raise FieldError("early_stopping.max_steps", str(exc)) from exc
    stored = {**submit.model_dump(mode="json"), "base": submit_body(base)}
    record = repo.create_sweep(submit.name, base.user, stored)
    on_change()
    return sweep_info(record, repo)


def _corners(submit: SweepSubmit, base: JobSubmit) -> list[tuple[str, dict[str, Any]]]:
    """The base, then the base with each dimension at each end (each choice)."""
    corners = [("base", submit_body(base))]
    for path, dim in submit.space.items():
        for value in _ends(dim):
            body = submit_body(base)
            try:
                set_path(body, path, value)
            except (KeyError, IndexError, ValueError, TypeError) as exc:
                raise FieldError(f"space.{path}", "the base job has no field here") from exc
            corners.append((f"space.{path}", body))
    return corners


def _ends(dim: Dimension) -> list[Any]:
    if isinstance(dim, Choice):
        return list(dim.values)
    if isinstance(dim, IntRange):
        return [dim.low, dim.low + (dim.high - dim.low) // dim.step * dim.step]
    return [dim.low, dim.high]


@router.get("/v1/sweeps/{sweep_id}", response_model=SweepInfo, responses=ERROR_RESPONSES)
def get_sweep(sweep_id: SweepId, repo: Repo) -> SweepInfo:
    """The sweep, every trial (parameters, objective at each rung, state, GPU-seconds) and
    the best completed trial's parameters as a job body."""
    return sweep_info(repo.sweep(sweep_id), repo)


@router.post("/v1/sweeps/{sweep_id}/cancel", response_model=SweepInfo, responses=ERROR_RESPONSES)
def cancel_sweep(
    sweep_id: SweepId, caller: Caller, *, repo: Repo, request: Request, on_change: OnChange
) -> SweepInfo:
    """End the sweep and cancel every trial that has not ended."""
    record = repo.sweep(sweep_id)
    require_owner(caller, record.user, f"sweep {sweep_id}")
    reason = f"cancelled by {who(caller, request)}"
    if repo.end_sweep(sweep_id, SweepState.CANCELLED, reason):
        for trial in record.trials:
            _stop_trial(repo, record.id, trial.number, trial.job_id, reason)
    on_change()
    return sweep_info(repo.sweep(sweep_id), repo)


def _stop_trial(repo: JobRepository, sweep_id: int, number: int, job_id: int, reason: str) -> None:
    with contextlib.suppress(IllegalTransition, StaleState):
        repo.transition(job_id, JobState.CANCELLED, reason=f"sweep {sweep_id} {reason}")
    state = repo.get(job_id).state
    if state is JobState.CANCELLED:
        repo.update_trial(sweep_id, number, state=TrialState.STOPPED)


def sweep_info(record: SweepRecord, repo: JobRepository) -> SweepInfo:
    plan = sweep_plan(record.spec)
    jobs = {j.id: j for j in repo.many(t.job_id for t in record.trials)}
    now = repo.now()
    trials = [
        SweepTrialInfo(
            number=t.number,
            job_id=t.job_id,
            params=t.params,
            state=t.state.value,
            job_state=jobs[t.job_id].state,
            rung=t.rung,
            objective=t.values[max(t.values)] if t.values else None,
            rung_values=t.values,
            step=jobs[t.job_id].step,
            gpu_seconds=gpu_seconds(jobs[t.job_id], now),
        )
        for t in record.trials
    ]
    return SweepInfo(
        id=record.id,
        name=record.name,
        user=record.user,
        state=record.state.value,
        reason=record.reason,
        submitted_at=record.submitted_at,
        finished_at=record.finished_at,
        objective=Objective(metric=plan.metric, mode="min" if plan.minimize else "max"),
        searcher=plan.request.searcher,
        rung_steps=list(plan.rung_steps),
        max_trials=plan.budget.max_trials,
        max_concurrent=plan.budget.max_concurrent,
        trials=trials,
        best=_best(trials, plan.request, plan.minimize),
        gpu_seconds=sum(t.gpu_seconds for t in trials),
    )


def gpu_seconds(job: JobRecord, now: datetime) -> float:
    """GPU time the job has had: its ended runs, and the current one."""
    current = 0.0
    if job.started_at is not None and job.state in (JobState.RUNNING, JobState.PREEMPTING):
        current = max(0.0, (now - job.started_at).total_seconds()) * job.num_gpus
    return job.attained_gpu_s + current


def _best(trials: list[SweepTrialInfo], request: SweepSubmit, minimize: bool) -> SweepBest | None:
    done = [(t.objective, t) for t in trials if t.state == "completed" and t.objective is not None]
    if not done:
        return None
    value, best = min(done, key=lambda d: (d[0] if minimize else -d[0], d[1].number))
    body = submit_body(request.base)
    for path, param in best.params.items():
        set_path(body, path, param)
    return SweepBest(
        trial=best.number,
        value=value,
        params=best.params,
        job=JobSubmit.model_validate(body, context={"stored": True}),
    )
