"""The status page: two HTML shells (`/` and `/jobs/{id}`) and the fragments they poll.

The shells hold no data, so they are open; the script in `static/gangway.js` fetches each
fragment (`/ui/...`, HTML rendered here from the store) every few seconds with the API key
the user gave the page, and swaps it in. Rendering stays on the server, in Jinja, next to
the API it mirrors; the browser keeps only the paging and filter state of each section.
Every list is paged, so the page costs the same with 10 jobs or 10,000, 2 nodes or 200.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from api.auth import Caller, current_caller, sees_env
from api.charts import Series, line_chart, scatter_chart, sparkline
from api.convert import (
    cluster_info,
    job_checkpoints,
    job_dependencies,
    job_event,
    job_info,
    placed_mesh,
    prediction_accuracy,
)
from api.errors import StoreUnavailable
from api.registry import model_info
from api.routes import MAX_ID, JobId, Repo
from api.sweeps import SweepId, sweep_info
from gangway.models import CheckpointInfo, JobState, SweepInfo, metric_order
from scheduler.model import RESOURCE_HOLDING_STATES
from scheduler.store import JobRecord, JobRepository, MetricPoint
from scheduler.store.predictions import JobPrediction
from scheduler.store.registry import ModelRegistry
from scheduler.store.reported import MAX_PAGE, StoredPoint

PAGE_SIZE = 20
# A version's metrics the models table shows.
SHOWN_METRICS = ("val_loss", "val_token_accuracy", "loss")
MAX_CHART_POINTS = MAX_PAGE  # reports drawn per job page (every one, up to this)
MAX_CHARTS = 32
# How the built-in trainer's events name a bad step it acted on (workers.engine.health).
_INSTABILITY = re.compile(r"instability at step (\d+)")

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
shells = APIRouter(include_in_schema=False)
fragments = APIRouter(include_in_schema=False, dependencies=[Depends(current_caller)])

Page = Annotated[int, Query(ge=1, le=100_000)]


def _color(job_id: int) -> str:
    """A stable, well-spread hue per job (the golden angle), the same in every view."""
    return f"hsl({job_id * 137.508 % 360:.0f} 62% 52%)"


def _ago(then: datetime | None, now: datetime) -> str:
    return _duration((now - then).total_seconds()) if then is not None else "-"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _runtime(job: JobRecord, now: datetime) -> str:
    if job.started_at is None:
        return "-"
    return _duration(((job.finished_at or now) - job.started_at).total_seconds())


def _render(request: Request, template: str, **context: Any) -> HTMLResponse:
    context.setdefault("color", _color)
    return templates.TemplateResponse(request, template, context)


def _paged(items: list[Any], page: int) -> tuple[list[Any], int, int]:
    """One page of `items`, the page shown (a page past the end shows the last) and the
    number of pages."""
    pages = max(1, -(-len(items) // PAGE_SIZE))
    page = min(page, pages)
    return items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE], page, pages


# -- shells -------------------------------------------------------------------------------


@shells.get("/", response_class=HTMLResponse)
def overview(request: Request) -> HTMLResponse:
    return _render(request, "overview.html", states=[s.value for s in JobState])


@shells.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: JobId) -> HTMLResponse:
    return _render(request, "job.html", job_id=job_id)


# -- overview fragments ---------------------------------------------------------------------


@fragments.get("/ui/cluster", response_class=HTMLResponse)
def cluster_fragment(request: Request, repo: Repo, page: Page = 1) -> HTMLResponse:
    holders = repo.in_states(RESOURCE_HOLDING_STATES)
    cluster = cluster_info(repo.nodes(), holders)
    nodes, page, pages = _paged(cluster.nodes, page)
    alive = sum(1 for n in cluster.nodes if n.alive)
    used = cluster.gpus_allocated / cluster.gpus_total if cluster.gpus_total else 0.0
    return _render(
        request,
        "_cluster.html",
        cluster=cluster,
        nodes=nodes,
        page=page,
        pages=pages,
        alive=alive,
        utilization=used,
        names={job.id: job.name for job in holders},
    )


def _queue_order(pending: list[JobRecord]) -> list[JobRecord]:
    """The scheduler's order as of its last pass (jobs it has not seen yet last)."""

    def position(job: JobRecord) -> tuple[int, int]:
        at = (job.explanation or {}).get("queue_position")
        return (at if isinstance(at, int) else 1 << 30, job.id)

    return sorted(pending, key=position)


@fragments.get("/ui/queue", response_class=HTMLResponse)
def queue_fragment(request: Request, repo: Repo, page: Page = 1) -> HTMLResponse:
    ordered = _queue_order(repo.in_states([JobState.PENDING]))
    jobs, page, pages = _paged(ordered, page)
    now = repo.now()
    predicted = repo.predictions(job.id for job in jobs)
    return _render(
        request,
        "_queue.html",
        predicted=lambda job: _predicted(predicted.get(job.id)),
        basis=lambda job: predicted[job.id].basis if job.id in predicted else "",
        accuracy=_accuracy_line(repo),
        jobs=jobs,
        total=len(ordered),
        page=page,
        pages=pages,
        waited=lambda job: _ago(job.queued_at or job.submitted_at, now),
        eta=lambda job: _eta(job.estimated_start_at, now),
    )


def _predicted(prediction: JobPrediction | None) -> str:
    if prediction is None or prediction.runtime_s is None:
        return "unknown"
    return f"{_duration(prediction.runtime_s)} ({prediction.source})"


def _accuracy_line(repo: JobRepository) -> str:
    """How good run-time predictions were on this cluster's succeeded jobs, in words."""
    found = prediction_accuracy(repo.accuracy_pairs())
    if found.median_ape is None:
        return "Run-time predictions: no predicted job has finished yet."
    return (
        f"Run-time predictions were off by {found.median_ape:.0%} (median) on "
        f"{found.predicted} finished jobs ({found.unknown} unknown)."
    )


def _eta(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "unknown"
    if at <= now:
        return "next pass"
    return f"in {_duration((at - now).total_seconds())}"


@fragments.get("/ui/jobs", response_class=HTMLResponse)
def jobs_fragment(
    request: Request,
    repo: Repo,
    *,
    state: Annotated[JobState | None, Query()] = None,
    queue: Annotated[str | None, Query(max_length=100)] = None,
    user: Annotated[str | None, Query(max_length=100)] = None,
    cursor: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> HTMLResponse:
    records = repo.page(
        states=[state] if state else (),
        queue=queue or None,
        user=user or None,
        limit=PAGE_SIZE + 1,
        before_id=cursor,
    )
    jobs = records[:PAGE_SIZE]
    trends = repo.recent_losses([job.id for job in jobs])
    now = repo.now()
    return _render(
        request,
        "_jobs.html",
        jobs=jobs,
        next_cursor=jobs[-1].id if len(records) > PAGE_SIZE else None,
        first_page=cursor is None,
        sparkline=lambda job: sparkline(trends.get(job.id, [])),
        runtime=lambda job: _runtime(job, now),
    )


# -- job page fragments -------------------------------------------------------------------


@fragments.get("/ui/jobs/{job_id}/summary", response_class=HTMLResponse)
def job_summary(request: Request, job_id: JobId, caller: Caller, repo: Repo) -> HTMLResponse:
    record = repo.get(job_id)
    predicted = repo.predictions([job_id]).get(job_id)
    names = {n.id: n.name for n in repo.nodes()}
    info = job_info(
        record,
        names,
        predicted,
        shows_env=sees_env(caller, record.user),
        objective=repo.objectives([job_id]).get(job_id),
    )
    now = repo.now()
    return _render(
        request,
        "_job_summary.html",
        job=info,
        mesh=placed_mesh(record),
        spec=json.dumps(info.spec.model_dump(mode="json"), indent=2),
        checkpoints=_checkpoints(request, job_id),
        runtime=_runtime(record, now),
        eta=_eta(record.estimated_start_at, now),
        ends=_eta(info.estimated_end_at, now) if info.estimated_end_at else None,
        predicted=_predicted(predicted),
        links=job_dependencies(repo.links(job_id)),
    )


def _checkpoints(request: Request, job_id: int) -> list[CheckpointInfo]:
    """The job's checkpoints for its page; a store that cannot be read just now shows
    none (the page stays up; GET /v1/jobs/{id}/checkpoints says 503)."""
    try:
        return job_checkpoints(
            request.app.state.checkpoint_root, job_id, request.app.state.checkpoint_store
        ).checkpoints
    except StoreUnavailable:
        return []


def _series(points: list[MetricPoint], field: str) -> Series:
    values = [(p.step, getattr(p, field)) for p in points if getattr(p, field) is not None]
    breaks = [b.step for a, b in itertools.pairwise(points) if b.attempt != a.attempt]
    return Series(points=[(float(x), float(y)) for x, y in values], breaks=breaks)


@fragments.get("/ui/jobs/{job_id}/charts", response_class=HTMLResponse)
def job_charts(request: Request, job_id: JobId, repo: Repo) -> HTMLResponse:
    """A chart per metric the job reported, every point of it (the first
    `MAX_CHART_POINTS` reports), with each resume and each bad step the trainer acted on
    marked; a job that reported nothing by name shows the service's samples."""
    reported, more = repo.reported_points(job_id, limit=MAX_CHART_POINTS)
    if not reported:
        return _render(request, "_job_charts.html", charts=_sampled_charts(repo, job_id))
    record = repo.get(job_id)
    objective = record.spec.objective.metric if record.spec.objective else None
    marks = instability_steps(e.reason for e in repo.events(job_id))
    names = metric_order(repo.metric_names(job_id), objective)[:MAX_CHARTS]
    cut = f" (first {len(reported):,} reports)" if more is not None else ""
    charts = [
        line_chart(_reported_series(reported, name, marks), title=name + cut) for name in names
    ]
    return _render(request, "_job_charts.html", charts=charts)


def _reported_series(points: list[StoredPoint], name: str, marks: Sequence[int]) -> Series:
    carrying = [p for p in points if name in p.values]
    breaks = [b.step for a, b in itertools.pairwise(carrying) if b.attempt != a.attempt]
    values = [(float(p.step), float(p.values[name])) for p in carrying]
    return Series(points=values, breaks=breaks, marks=[float(step) for step in marks])


def _sampled_charts(repo: JobRepository, job_id: int) -> list[Markup]:
    points = repo.metrics(job_id, max_points=300)
    return [
        line_chart(_series(points, "loss"), title="loss"),
        line_chart(_series(points, "tokens_per_s"), title="tokens/s"),
        line_chart(_series(points, "step_time_s"), title="step time (s)"),
        line_chart(_series(points, "comm_s"), title=_comm_title(points)),
    ]


def _comm_title(points: list[MetricPoint]) -> str:
    """The communication chart's title carries the summary: over the points shown, the
    share of step time in collectives and the bytes sent per step."""
    timed = [p for p in points if p.comm_s is not None and p.step_time_s]
    if not timed:
        return "time in collectives (s)"
    share = sum(p.comm_s or 0.0 for p in timed) / sum(p.step_time_s or 0.0 for p in timed)
    sent = sum(p.comm_bytes or 0.0 for p in timed) / len(timed) / 2**20
    return f"time in collectives (s): {share:.0%} of step time, {sent:,.1f} MiB/step"


@fragments.get("/ui/models", response_class=HTMLResponse)
def models_fragment(request: Request, caller: Caller) -> HTMLResponse:
    """The models the caller may read, newest version first, with lineage and aliases."""
    registry: ModelRegistry = request.app.state.registry
    readable = [registry.model(m.name) for m in registry.models() if m.readable_by(caller)]
    models = [model_info(m) for m in readable]
    return _render(request, "_models.html", models=models, shown_metrics=SHOWN_METRICS)


@shells.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(request: Request, sweep_id: SweepId) -> HTMLResponse:
    return _render(request, "sweep.html", sweep_id=sweep_id)


@fragments.get("/ui/sweeps", response_class=HTMLResponse)
def sweeps_fragment(request: Request, repo: Repo) -> HTMLResponse:
    """The newest sweeps, linked to their pages."""
    return _render(request, "_sweeps.html", sweeps=repo.sweeps(limit=20))


@fragments.get("/ui/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_fragment(request: Request, sweep_id: SweepId, caller: Caller, repo: Repo) -> HTMLResponse:
    """A sweep's trials as a table, and its objective against time and each parameter."""
    info = sweep_info(repo.sweep(sweep_id), repo, caller)
    return _render(
        request,
        "_sweep.html",
        sweep=info,
        charts=Markup("").join(_sweep_charts(info)),
        best_body=json.dumps(info.best.job.model_dump(mode="json"), indent=2) if info.best else "",
    )


def _sweep_charts(info: SweepInfo) -> list[Markup]:
    """The objective against minutes since the sweep began (when each trial last moved)
    and against each parameter (log-spaced where the space draws it so)."""
    scored = [(t, t.objective) for t in info.trials if t.objective is not None]
    metric = info.objective.metric
    when = [((t.moved_at - info.submitted_at).total_seconds() / 60, y) for t, y in scored]
    charts = [scatter_chart(when, title=f"{metric} by time", x_label="minutes")]
    for name, dim in info.space.items():
        points = [
            (float(t.params[name]), y)
            for t, y in scored
            if isinstance(t.params.get(name), int | float)
        ]
        if points:
            title, log_x = f"{metric} by {name}", dim.kind == "log_uniform"
            charts.append(scatter_chart(points, title=title, x_label=name, log_x=log_x))
    return charts


@fragments.get("/ui/jobs/{job_id}/events", response_class=HTMLResponse)
def job_events(request: Request, job_id: JobId, repo: Repo) -> HTMLResponse:
    repo.get(job_id)
    events = [job_event(e) for e in repo.events(job_id)]
    return _render(request, "_job_events.html", events=list(reversed(events)))


def instability_steps(reasons: Iterable[str]) -> list[int]:
    """The steps the job's events name as bad steps the trainer acted on."""
    return [int(m.group(1)) for reason in reasons if (m := _INSTABILITY.search(reason))]
