"""Store records -> wire models. Reads the store only: no Ray call in a request."""

from __future__ import annotations

import json
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError

from api.errors import StoreUnavailable
from gangway.models import (
    REDACTED,
    STORED,
    CheckpointInfo,
    ClusterInfo,
    DependencyLink,
    JobCheckpoints,
    JobDependencies,
    JobEvent,
    JobExplanation,
    JobInfo,
    JobSubmit,
    NodeInfo,
    ObjectiveValue,
    PredictionAccuracy,
    Progress,
    QueueInfo,
    QueueSpec,
    RankPlacement,
    RuntimePrediction,
    Straggler,
    WaitExplanation,
)
from scheduler.core import free_capacity
from scheduler.core.quotas import NO_QUOTA, borrowing_jobs, gpus_by_queue
from scheduler.model import JobState, Node, Parallelism, QueueQuota
from scheduler.predict.runtime import accuracy
from scheduler.runtime.views import job_view
from scheduler.store import EventRecord, JobRecord
from scheduler.store.dependencies import Link, Links
from scheduler.store.predictions import AccuracyPair, JobPrediction
from scheduler.store.reported import ObjectiveBest
from workers.checkpoint_layout import ListingCache, job_directory
from workers.checkpoint_store import CheckpointStore

# The status page polls a job's checkpoints: listed again only when they change.
_CHECKPOINTS = ListingCache()


@contextmanager
def reading_the_store(
    what: str = "checkpoint", passes: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
    """The `what` store or the network failing in the block is a 503
    (`StoreUnavailable`), which the request may retry, never a 500. The database's
    errors keep their own answer, and so do `passes` (a changed file's 409)."""
    kept: tuple[type[Exception], ...] = (DBAPIError, *passes)
    try:
        yield
    except kept:
        raise
    except Exception as exc:
        raise StoreUnavailable(
            f"the {what} store could not be read just now ({type(exc).__name__}: {exc})"
        ) from exc


def job_checkpoints(
    root: Path | None, job_id: int, store: CheckpointStore | None = None
) -> JobCheckpoints:
    """The job's complete checkpoints: in its store when it has one, else its folder."""
    if store is not None:
        job = store.job(job_id)
        with reading_the_store():
            saved = job.listing()
        return JobCheckpoints(
            directory=job.url,
            checkpoints=[
                CheckpointInfo(step=c.step, path=c.url, bytes=c.bytes, saved_at=c.saved_at)
                for c in saved
            ],
        )
    if root is None:
        return JobCheckpoints(directory=None, checkpoints=[])
    directory = job_directory(root, job_id)
    return JobCheckpoints(
        directory=str(directory),
        checkpoints=[
            CheckpointInfo(step=c.step, path=str(c.path), bytes=c.bytes, saved_at=c.saved_at)
            for c in _CHECKPOINTS.listing(directory)
        ],
    )


def queue_quota(spec: QueueSpec) -> QueueQuota:
    """A quota as an admin (PUT /v1/queues/{name}) or `GANGWAY_QUEUES` sets it."""
    return QueueQuota(spec.guaranteed_gpus, spec.borrow_limit_gpus, spec.weight)


def queue_infos(
    quotas: Mapping[str, QueueQuota],
    members: Mapping[str, Sequence[str]],
    holders: Sequence[JobRecord],
    counts: Mapping[tuple[JobState, str], int],
    also: str = "",
) -> list[QueueInfo]:
    """Every configured queue, every queue with members, every queue a job names, and
    `also` (unless empty)."""
    views = [job_view(job) for job in holders]
    used = gpus_by_queue(views)
    borrowers = borrowing_jobs(views, quotas)
    borrowed = gpus_by_queue(view for view in views if view.id in borrowers)
    holding = Counter(view.queue for view in views)
    names = set(quotas) | set(members) | {queue for _, queue in counts} | ({also} - {""})
    infos = []
    for name in sorted(names):
        quota = quotas.get(name, NO_QUOTA)
        infos.append(
            QueueInfo(
                name=name,
                guaranteed_gpus=quota.guaranteed_gpus,
                borrow_limit_gpus=quota.borrow_limit_gpus,
                weight=quota.weight,
                gpus_in_use=used.get(name, 0),
                gpus_borrowed=borrowed.get(name, 0),
                jobs_pending=counts.get((JobState.PENDING, name), 0),
                jobs_holding_gpus=holding[name],
                members=list(members.get(name, ())),
            )
        )
    return infos


def job_dependencies(links: Links) -> JobDependencies:
    return JobDependencies(
        upstream=[_link(link) for link in links.upstream],
        downstream=[_link(link) for link in links.downstream],
    )


def _link(link: Link) -> DependencyLink:
    return DependencyLink(
        job=link.job_id,
        name=link.name,
        state=link.state,
        on=link.condition.value,
        waiting=link.waiting,
        met_at=link.met_at,
    )


def job_explanation(job: JobRecord, now: datetime, links: Links) -> JobExplanation:
    why = job.explanation or {}
    linked = job_dependencies(links)
    pending = job.state is JobState.PENDING
    queued_s = (now - job.queued_at).total_seconds() if pending and job.queued_at else None
    return JobExplanation(
        job_id=job.id,
        state=job.state,
        reason=job.status_reason,
        queue=job.queue,
        priority=job.priority,
        queue_position=why.get("queue_position"),
        estimated_start_at=job.estimated_start_at,
        blocker=why.get("blocker"),
        message=why.get("message"),
        unblock=why.get("unblock"),
        blocking_job_id=why.get("blocking_job_id"),
        queued_s=queued_s,
        attained_gpu_hours=job.attained_gpu_s / 3600.0,
        upstream=linked.upstream,
        downstream=linked.downstream,
    )


def placed_mesh(job: JobRecord) -> Parallelism:
    """The job's mesh as placed: an elastic job's dp is the one its placement shows."""
    return job.spec.placed(job.placement).parallelism


def prediction_accuracy(pairs: Sequence[AccuracyPair]) -> PredictionAccuracy:
    found = accuracy([(p.predicted_s, p.actual_s) for p in pairs])
    return PredictionAccuracy(
        predicted=found.predicted,
        unknown=found.unknown,
        median_ape=found.median_ape,
        spearman=found.spearman,
    )


def runtime_prediction(p: JobPrediction) -> RuntimePrediction:
    return RuntimePrediction(
        runtime_s=p.runtime_s,
        remaining_s=p.remaining_s,
        low_s=p.low_s,
        high_s=p.high_s,
        source=p.source,
        basis=p.basis,
        step_time_s=p.step_time_s,
    )


def objective_value(best: ObjectiveBest) -> ObjectiveValue:
    return ObjectiveValue.model_validate(asdict(best))


def job_info(
    job: JobRecord,
    node_names: dict[str, str],
    prediction: JobPrediction | None = None,
    *,
    shows_env: bool,
    objective: ObjectiveBest | None = None,
) -> JobInfo:
    """`prediction`: the service's latest for the job (the end only while it is active).
    `shows_env`: whether the caller may read the env values (see `api.auth.sees_env`);
    the spec never carries the secrets, only `secret_names` does."""
    placement = None
    if job.placement is not None:
        mesh = placed_mesh(job)
        placement = []
        for rank, node_id in enumerate(job.placement):
            pp_rank, dp_rank, tp_rank = mesh.coordinates(rank)
            placement.append(
                RankPlacement(
                    rank=rank,
                    node_id=node_id,
                    node_name=node_names.get(node_id, node_id),
                    pp_rank=pp_rank,
                    dp_rank=dp_rank,
                    tp_rank=tp_rank,
                )
            )
    return JobInfo(
        id=job.id,
        name=job.name,
        queue=job.queue,
        user=job.user,
        priority=job.priority,
        state=job.state,
        status_reason=job.status_reason,
        error=job.error,
        num_gpus=job.num_gpus,
        attempt=job.attempt,
        restarts=job.restarts,
        submitted_at=job.submitted_at,
        admitted_at=job.admitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        spec=shown_spec(submitted_spec(job), shows_env=shows_env),
        secret_names=sorted(job.spec.code.secrets),
        placement=placement,
        estimated_start_at=job.estimated_start_at,
        explanation=WaitExplanation.model_validate(job.explanation) if job.explanation else None,
        prediction=runtime_prediction(prediction) if prediction else None,
        estimated_end_at=None
        if prediction is None or job.state.is_terminal
        else prediction.estimated_end_at,
        pipeline_id=job.pipeline_id,
        progress=Progress(
            step=job.step,
            total_steps=job.total_steps,
            loss=job.loss,
            first_loss=job.first_loss,
            tokens_per_s=job.tokens_per_s,
            updated_at=job.progress_at,
            objective=objective_value(objective) if objective is not None else None,
            stragglers=[
                Straggler(
                    rank=s["rank"],
                    node_name=node_names.get(s["node_id"], s["node_id"]),
                    local_s=s["local_s"],
                    ratio=s["ratio"],
                )
                for s in job.stragglers
            ],
        ),
    )


class _SpecCache:
    """The wire models of the specs read lately, under a budget of their size as JSON.

    A job's stored spec never changes, and a page lists up to 500 jobs, polled every few
    seconds: comparing the stored JSON with the one cached (~1 us) replaces validating
    it again (~10 us; `model_construct` of the nested models is slower still, ~19 us).
    A mismatch (another database, an id reused after a retention sweep) validates
    afresh, so the cache can only save work, never change an answer. The size is
    measured once, when a spec is first read (a body may be up to GANGWAY_MAX_BODY_BYTES).
    """

    def __init__(self, max_bytes: int, max_item_bytes: int) -> None:
        self._max_bytes, self._max_item_bytes = max_bytes, max_item_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, datetime], tuple[Any, JobSubmit, int]] = OrderedDict()

    def get(self, job: JobRecord) -> JobSubmit:
        key = (job.id, job.submitted_at)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is not None and entry[0] == job.spec_json:
            return entry[1]
        spec = JobSubmit.model_validate(job.spec_json, context=STORED)
        size = len(json.dumps(job.spec_json))
        if size > self._max_item_bytes:
            return spec  # a large one would push out many small ones
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes += size - (old[2] if old else 0)
            self._entries[key] = (job.spec_json, spec, size)
            while self._bytes > self._max_bytes:
                _, (_, _, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
        return spec


# ~3,000 typical specs (~0.7 KB of JSON each): several full pages.
_SPECS = _SpecCache(max_bytes=2 * 1024 * 1024, max_item_bytes=64 * 1024)


def submitted_spec(job: JobRecord) -> JobSubmit:
    """The job's body as submitted, as the wire model: validated when it was stored and
    again on its first read here (so a field added since takes its default), then
    served from `_SPECS` while it is unchanged. Callers must not mutate it."""
    return _SPECS.get(job)


def shown_spec(spec: JobSubmit, *, shows_env: bool) -> JobSubmit:
    """The spec as a response shows it: never the secrets' values (the field is also left
    out of every dump, this keeps them out of the object too), and env values only for
    those who may read them."""
    if not spec.secrets and (shows_env or not spec.env):
        return spec
    env = spec.env if shows_env else dict.fromkeys(spec.env, REDACTED)
    return spec.model_copy(update={"env": env, "secrets": {}})


def job_event(event: EventRecord) -> JobEvent:
    return JobEvent(
        id=event.id,
        at=event.at,
        from_state=event.from_state,
        to_state=event.to_state,
        reason=event.reason,
    )


def cluster_info(nodes: Sequence[Node], holders: Sequence[JobRecord]) -> ClusterInfo:
    views = sorted((job_view(j) for j in holders), key=lambda view: view.id)
    free = free_capacity(nodes, views)
    slots: dict[str, list[int]] = {}  # node -> the job holding each allocated GPU
    for view in views:
        for node_id in view.placement.node_ids if view.placement else ():
            slots.setdefault(node_id, []).extend([view.id] * view.shape.gpus_per_rank)
    infos = []
    for node in nodes:
        gpus_free = free[node.id].gpus if node.id in free else 0
        held = slots.get(node.id, [])[: node.num_gpus]
        infos.append(
            NodeInfo(
                id=node.id,
                name=node.name,
                alive=node.alive,
                gpu_type=node.gpu_type,
                gpu_speed=node.gpu_speed,
                gpus_total=node.num_gpus,
                gpus_allocated=node.num_gpus - gpus_free if node.alive else 0,
                gpus_free=gpus_free,
                cpus_total=node.num_cpus,
                jobs=sorted(set(held)),
                gpu_holders=[*held, *[None] * (node.num_gpus - len(held))],
            )
        )
    alive = [n for n in infos if n.alive]
    return ClusterInfo(
        nodes=infos,
        gpus_total=sum(n.gpus_total for n in alive),
        gpus_allocated=sum(n.gpus_allocated for n in alive),
        gpus_free=sum(n.gpus_free for n in alive),
    )
