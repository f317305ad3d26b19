"""Ask before you submit: a job body's predicted step time, run time and earliest start,
and the plan `"parallelism": "auto"` resolves to.

The earliest start is the pure core's own answer: one scheduling pass over the store's
current jobs with the candidate added, read back from the candidate's decision. The API
keeps its own `Predictions` (fed from the store like the loop's), so an estimate works
on any replica, leader or not.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from api.convert import runtime_prediction
from api.errors import FieldError
from api.validation import check_model, runnable_plan, validate_submission
from gangway.models import (
    Builtin,
    Estimate,
    JobSubmit,
    Parallelism,
)
from scheduler.core import PolicyConfig, schedule
from scheduler.core.decisions import Admit, Wait
from scheduler.model import RESOURCE_HOLDING_STATES, ClusterSnapshot, JobState, JobView, QueueQuota
from scheduler.predict.runtime import JobFeatures
from scheduler.predict.steptime import Choice, auto_plan
from scheduler.runtime.predictions import Predictions
from scheduler.runtime.trainer_shapes import common_node_type, trainer_job
from scheduler.runtime.working_set import WorkingSet
from scheduler.store import JobRepository
from scheduler.store.predictions import JobPrediction
from scheduler.store.specs import spec_from_json


@dataclass(frozen=True, slots=True)
class Resolved:
    """A submission with a concrete plan; `choice` says how "auto" was resolved."""

    submit: JobSubmit
    choice: Choice | None = None


class Estimator:
    def __init__(self, repo: JobRepository, policy: PolicyConfig) -> None:
        self._repo = repo
        self._policy = policy
        self._predictions = Predictions(repo)
        # The active jobs, kept between estimates as the loop keeps them between passes.
        self._jobs = WorkingSet(repo, (JobState.PENDING, *RESOURCE_HOLDING_STATES))
        self._lock = threading.Lock()  # requests run on a thread pool

    def resolve(self, submit: JobSubmit) -> Resolved:
        """`"parallelism": "auto"` -> the plan that finishes soonest and fits memory."""
        if submit.parallelism != "auto":
            return Resolved(submit)
        entry = submit.entrypoint
        if not isinstance(entry, Builtin):
            raise FieldError("parallelism", '"auto" needs the built-in trainer')
        check_model(entry)  # planned for below, before the submit's own checks
        node = common_node_type(self._repo.nodes())
        if node is None:
            raise FieldError("parallelism", '"auto" needs a live node to plan for')
        with self._lock:
            self._predictions.refresh()
            calibration = self._predictions.planning_calibration(node)
        concrete = submit.model_copy(update={"parallelism": Parallelism()})
        trainer = trainer_job(spec_from_json(concrete.model_dump(mode="json")))
        assert trainer is not None  # a built-in job with a known model (validated)
        choice = auto_plan(
            calibration,
            trainer.model,
            gpus=submit.gpu_budget or node.devices_per_node,
            global_batch=entry.batch_size * entry.grad_accumulation,
            steps=entry.steps,
            precision=entry.precision,
            schedule=entry.pipeline_schedule,
            runnable=functools.partial(runnable_plan, entry),
        )
        if choice is None:
            raise FieldError("gpu_budget", "no plan within this GPU budget fits memory")
        plan = choice.plan
        settings = {
            "batch_size": plan.batch_size,
            "grad_accumulation": plan.grad_accumulation,
            "microbatches": plan.microbatches,
        }
        parallelism = Parallelism(dp=plan.dp, tp=plan.tp, pp=plan.pp, fsdp=plan.fsdp)
        update = {"parallelism": parallelism, "entrypoint": entry.model_copy(update=settings)}
        return Resolved(submit.model_copy(update=update), choice)

    def estimate(self, submit: JobSubmit, queues: Mapping[str, QueueQuota]) -> Estimate:
        resolved = self.resolve(submit)
        concrete = resolved.submit
        spec = spec_from_json(concrete.model_dump(mode="json"))
        nodes = self._repo.nodes()
        validate_submission(concrete, spec, nodes)
        now = self._repo.now()
        features = JobFeatures(concrete.queue, concrete.user, concrete.name, spec.shape.num_gpus)
        with self._lock:
            jobs = self._jobs.load()  # what changed since the last estimate, reread
            views = self._predictions.views(jobs, self._jobs, nodes, now)
            predicted = self._predictions.predict_new(spec, features, common_node_type(nodes))
        candidate = JobView(
            id=max((j.id for j in jobs), default=0) + 1,
            priority=concrete.priority,
            submitted_at=now,
            state=JobState.PENDING,
            shape=spec.shape,
            preemptible=spec.preemptible,
            time_limit_s=spec.time_limit_s,
            queue=concrete.queue,
            user=concrete.user,
            # as the loop would hand it to the core (assumed speeds: unknown to it)
            predicted_remaining_s=None if predicted.assumed else predicted.runtime_s,
        )
        decisions = schedule(
            ClusterSnapshot(tuple(nodes)), [*views, candidate], now, self._policy, queues=queues
        )
        start: datetime | None = now
        wait_reason = None
        for decision in decisions:
            if isinstance(decision, Wait) and decision.job_id == candidate.id:
                start, wait_reason = decision.estimated_start_at, decision.explanation.message
            elif isinstance(decision, Admit) and decision.job_id == candidate.id:
                start = now
        end = (
            start + timedelta(seconds=predicted.runtime_s)
            if start and predicted.runtime_s
            else None
        )
        return _estimate(
            concrete, resolved.choice, predicted, start=start, end=end, wait_reason=wait_reason
        )


def _estimate(
    submit: JobSubmit,
    choice: Choice | None,
    predicted: JobPrediction,
    *,
    start: datetime | None,
    end: datetime | None,
    wait_reason: str | None,
) -> Estimate:
    assert isinstance(submit.parallelism, Parallelism)
    chosen = submit.entrypoint if isinstance(submit.entrypoint, Builtin) and choice else None
    return Estimate(
        step_time_s=predicted.step_time_s,
        prediction=runtime_prediction(predicted),
        estimated_start_at=start,
        estimated_end_at=end,
        parallelism=submit.parallelism,
        batch_size=chosen.batch_size if chosen else None,
        grad_accumulation=chosen.grad_accumulation if chosen else None,
        microbatches=chosen.microbatches if chosen else None,
        plan_reason=choice.reason if choice else None,
        wait_reason=wait_reason,
    )
