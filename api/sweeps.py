"""REST v1 for sweeps: a search over a job's fields whose trials are ordinary jobs, run by
the scheduler loop's sweep controller (`scheduler.runtime.sweeps`).

A submit checks what it can of every trial before anything is stored: the base job gets
every check a job gets (`routes.prepared_job`), and so does the base with each dimension
at each end of its range (each value of a choice) and, for a float range, at a point
inside (an integer field refuses floats), then with every dimension at its low end and at
its high end together (a combination that can never fit). A 422 names `space.<path>` (or
`space` for a combination). The base is stored as checked (the plan "auto" chose, an
alias pinned, a script's path resolved). The controller validates each trial's body as a
job before it writes it; a combination between the corners that is not one ends the sweep
FAILED with the reason, and nothing invalid is stored.
"""

from __future__ import annotations

import contextlib
import copy
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from pydantic import ValidationError

from api.auth import Caller, Principal, current_caller, require_owner, sees_env
from api.convert import shown_spec
from api.errors import FieldError
from api.routes import ERROR_RESPONSES, MAX_ID, OnChange, Repo, admissible, prepared_job, who
from gangway.models import (
    REDACTED,
    Builtin,
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
from scheduler.runtime.searchers import MAX_GRID_TRIALS, grid_size
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
    prepared, _ = prepared_job(base, caller, repo=repo, request=request, nodes=nodes)
    _check_rule(submit)
    for field, body in _corners(submit, prepared.spec):
        try:
            job = JobSubmit.model_validate(body, context={"stored": True})
            prepared_job(job, caller, repo=repo, request=request, nodes=nodes)
        except ValidationError as exc:
            raise FieldError(field, str(exc.errors()[0]["msg"])) from exc
        except FieldError as exc:
            raise FieldError(field, f"{exc.field}: {exc.message}") from exc
    # Stored as checked: the plan "auto" chose, an alias pinned, a script's path resolved.
    stored = {**submit.model_dump(mode="json"), "base": prepared.spec}
    record = repo.create_sweep(submit.name, prepared.user, stored)
    on_change()
    return sweep_info(record, repo, caller)


def _check_rule(submit: SweepSubmit) -> None:
    """What early stopping and a grid need of the base and the space."""
    try:
        rungs_of(submit)
    except ValueError as exc:
        raise FieldError("early_stopping.max_steps", str(exc)) from exc
    entry = submit.base.entrypoint
    rule = submit.early_stopping
    if rule is not None and isinstance(entry, Builtin):
        if rule.max_steps is not None and rule.max_steps != entry.steps:
            raise FieldError(
                "early_stopping.max_steps",
                f"the built-in trainer's budget is its steps ({entry.steps}): leave it null",
            )
        if entry.update_mode == "async" or entry.pipeline_schedule == "zbv":
            raise FieldError(
                "early_stopping",
                f"the built-in trainer validates nothing under {entry.update_mode} updates "
                f"or the {entry.pipeline_schedule} schedule: no rung would have a value",
            )
    if submit.searcher == "grid" and submit.max_trials is None:
        points = grid_size(submit.space)
        if points > MAX_GRID_TRIALS:
            raise FieldError(
                "max_trials",
                f"the grid has {points:,} points: set max_trials (at most {MAX_GRID_TRIALS})",
            )


def _corners(submit: SweepSubmit, base: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The base with each dimension at each end (each choice) and, for a float range, at
    a point inside (an integer field refuses a float drawn from it); then with every
    dimension at its low end, and at its high end (a combination that never fits)."""
    lows = {path: _ends(dim)[0] for path, dim in submit.space.items()}
    highs = {path: _ends(dim)[-1] for path, dim in submit.space.items()}
    corners = [
        (f"space.{path}", _with(base, {path: value}))
        for path, dim in submit.space.items()
        for value in _ends(dim, inside=True)
    ]
    return [*corners, ("space", _with(base, lows)), ("space", _with(base, highs))]


def _with(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(base)
    for path, value in params.items():
        try:
            set_path(body, path, value)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise FieldError(f"space.{path}", "the base job has no field here") from exc
    return body


def _ends(dim: Dimension, *, inside: bool = False) -> list[Any]:
    if isinstance(dim, Choice):
        return list(dim.values)
    if isinstance(dim, IntRange):
        return [dim.low, dim.low + (dim.high - dim.low) // dim.step * dim.step]
    middle = (dim.low * dim.high) ** 0.5 if dim.kind == "log_uniform" else (dim.low + dim.high) / 2
    return [dim.low, middle + 1e-9 * abs(middle), dim.high] if inside else [dim.low, dim.high]


@router.get("/v1/sweeps/{sweep_id}", response_model=SweepInfo, responses=ERROR_RESPONSES)
def get_sweep(sweep_id: SweepId, caller: Caller, repo: Repo) -> SweepInfo:
    """The sweep, every trial (parameters, objective at each rung, state, GPU-seconds) and
    the best completed trial's parameters as a job body (env values, and env parameters,
    only for its owner and admins, as a job's)."""
    return sweep_info(repo.sweep(sweep_id), repo, caller)


@router.post("/v1/sweeps/{sweep_id}/cancel", response_model=SweepInfo, responses=ERROR_RESPONSES)
def cancel_sweep(
    sweep_id: SweepId, caller: Caller, *, repo: Repo, request: Request, on_change: OnChange
) -> SweepInfo:
    """End the sweep and cancel every trial that has not ended."""
    require_owner(caller, repo.sweep(sweep_id).user, f"sweep {sweep_id}")
    reason = f"cancelled by {who(caller, request)}"
    # Ended first: no trial is added after that (`add_trial` checks), so the trials read
    # next are all there are.
    if repo.end_sweep(sweep_id, SweepState.CANCELLED, reason):
        for trial in repo.sweep(sweep_id).trials:
            if not trial.state.ended:
                _stop_trial(repo, sweep_id, trial.number, trial.job_id, reason)
    on_change()
    return sweep_info(repo.sweep(sweep_id), repo, caller)


def _stop_trial(repo: JobRepository, sweep_id: int, number: int, job_id: int, reason: str) -> None:
    with contextlib.suppress(IllegalTransition, StaleState):
        repo.transition(job_id, JobState.CANCELLED, reason=f"sweep {sweep_id} {reason}")
    repo.update_trial(sweep_id, number, state=TrialState.STOPPED)


def sweep_info(record: SweepRecord, repo: JobRepository, caller: Principal) -> SweepInfo:
    plan = sweep_plan(record.spec)
    shows_env = sees_env(caller, record.user)
    jobs = {j.id: j for j in repo.many(t.job_id for t in record.trials)}
    now = repo.now()
    trials = [
        SweepTrialInfo(
            number=t.number,
            job_id=t.job_id,
            params=t.params if shows_env else _hidden(t.params),
            state=t.state.value,
            job_state=jobs[t.job_id].state,
            bracket=plan.bracket_of(t.number),
            rung=t.rung,
            objective=t.values[max(t.values)] if t.values else None,
            rung_values=t.values,
            step=jobs[t.job_id].step,
            gpu_seconds=gpu_seconds(jobs[t.job_id], now),
            moved_at=_moved_at(jobs[t.job_id]),
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
        space=plan.request.space,
        early_stopping=rule.rule if (rule := plan.request.early_stopping) else None,
        rung_steps=list(plan.rung_steps),
        max_trials=plan.budget.max_trials,
        max_concurrent=plan.budget.max_concurrent,
        trials=trials,
        best=_best(trials, plan.request, plan.minimize, shows_env=shows_env),
        gpu_seconds=sum(t.gpu_seconds for t in trials),
    )


def _moved_at(job: JobRecord) -> datetime:
    return job.finished_at or job.progress_at or job.updated_at


def gpu_seconds(job: JobRecord, now: datetime) -> float:
    """GPU time the job has had: its ended runs, and the current one."""
    current = 0.0
    if job.started_at is not None and job.state in (JobState.RUNNING, JobState.PREEMPTING):
        current = max(0.0, (now - job.started_at).total_seconds()) * job.num_gpus
    return job.attained_gpu_s + current


def _hidden(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as one who may not read the sweep's env sees them."""
    return {k: REDACTED if k.startswith("env.") else v for k, v in params.items()}


def _best(
    trials: list[SweepTrialInfo], request: SweepSubmit, minimize: bool, *, shows_env: bool
) -> SweepBest | None:
    done = [(t.objective, t) for t in trials if t.state == "completed" and t.objective is not None]
    if not done:
        return None
    value, best = min(done, key=lambda d: (d[0] if minimize else -d[0], d[1].number))
    body = submit_body(request.base)
    for path, param in best.params.items():
        set_path(body, path, param)
    job = JobSubmit.model_validate(body, context={"stored": True})
    return SweepBest(
        trial=best.number,
        value=value,
        params=best.params,
        job=shown_spec(job, shows_env=shows_env),
    )
