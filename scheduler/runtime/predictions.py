"""Every job's predicted run time, from this cluster's history, for the core and for users.

The loop asks `views` for the jobs it schedules (each `JobView` gets its
`predicted_remaining_s`), then `record`s what changed with the pass's estimated starts.
Where a prediction comes from, best first:

- steps: a built-in trainer that has reported steps: steps left x its measured step time;
- model: a built-in trainer not yet measured, on a node type with enough recorded runs of
  built-in jobs to calibrate the step-time model (`scheduler.predict.steptime`);
- history: the median run time of the most similar finished jobs
  (`scheduler.predict.runtime`), conditional on the time already run;
- model at assumed speeds: a built-in trainer nothing similar has run for, on a node type
  not yet measured (`steptime.assumed`; the service measures one with a few short runs of
  its own, `scheduler.runtime.calibration`, or `gangway calibrate`); shown and estimated
  with, never handed to the core, which treats the job as unknown;
- unknown: any other job nothing similar has finished for; the core then falls back to
  its default.

Each model prediction's basis names its calibration and its expected error, and its
low/high are the run time at that error either way.

History is loaded from the store at start and then incrementally (succeeded jobs only:
a failed or cancelled run says nothing about how long the work takes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from scheduler.core.decisions import Admit, Decision, Wait
from scheduler.model import (
    CALIBRATION_USER,
    RESOURCE_HOLDING_STATES,
    JobSpec,
    JobState,
    JobView,
    Node,
)
from scheduler.predict.gpu_speeds import measured_speeds, speeds_for
from scheduler.predict.runtime import JobFeatures, RuntimePredictor
from scheduler.predict.steptime import (
    Calibration,
    Measured,
    NodeType,
    assumed,
    calibrate,
    job_time_s,
)
from scheduler.runtime.prediction_writes import ending, moved
from scheduler.runtime.trainer_shapes import (
    REFERENCE_MODEL,
    REFERENCE_PLAN,
    TrainerJob,
    common_node_type,
    node_type,
    trainer_job,
)
from scheduler.runtime.working_set import WorkingSet
from scheduler.store import JobRecord, JobRepository
from scheduler.store.predictions import FinishedRun, JobPrediction

# Recorded runs of a node type needed before its step-time model is trusted.
MIN_CALIBRATION_RUNS = 3
# A running job's prediction is made anew at least this often (its row moving aside).
REPREDICT_RUNNING_S = 30.0


class Predictions:
    """History and calibrations of one cluster, kept current from the store."""

    def __init__(self, repo: JobRepository) -> None:
        self._repo = repo
        self._history = RuntimePredictor()
        self._measured: dict[str, list[Measured]] = defaultdict(list)
        self._calibrations: dict[str, Calibration] = {}
        self._since: datetime | None = None
        self._seen_at_since: set[int] = set()
        self._written: dict[int, JobPrediction] = {}
        self._current: dict[int, JobPrediction] = {}
        self._pending: set[int] = set()
        # Between passes: a job's prediction until its row or the history moves,
        # and each job's trainer shape (its spec never changes).
        self._learned = 0
        self._kept: dict[int, tuple[tuple[int, int, str | None], datetime, JobPrediction]] = {}
        self._trainers: dict[tuple[int, int], TrainerJob | None] = {}
        self._views: dict[int, tuple[JobView, JobView]] = {}
        self._recorded: dict[int, tuple[JobPrediction, datetime | None]] = {}
        # The last `views` answer: (what it read, when a holding job is due to be
        # predicted anew, the views); whether this pass reused it; the starts last recorded.
        self._last_views: (
            tuple[tuple[int, int, NodeType | None], datetime, list[JobView]] | None
        ) = None
        self._views_reused = False
        self._refreshed_at: int | None = None  # the working set's generation then
        self._last_starts: dict[int, datetime | None] = {}
        self._speeds: tuple[object, dict[str, float]] | None = None

    # -- history ------------------------------------------------------------------------

    def refresh(self) -> None:
        """Learn from the jobs that succeeded since the last call."""
        for run in self._repo.finished_runs(self._since):
            if run.job_id in self._seen_at_since:
                continue
            if self._since is None or run.finished_at > self._since:
                self._since, self._seen_at_since = run.finished_at, set()
            self._seen_at_since.add(run.job_id)
            self._learn(run)

    def _learn(self, run: FinishedRun) -> None:
        """A succeeded run: its run time for similar jobs' history, and a trainer's step
        time for its node type's model. Calibration runs teach the model only: as
        history they would make every stranger's job in their queue look a minute long."""
        self._learned += 1
        if run.user != CALIBRATION_USER:
            features = _features(run.queue, run.user, run.name, run.num_gpus)
            self._history.observe(features, run.runtime_s)
        trainer = trainer_job(run.spec, run.dp)
        if trainer and run.step_time_s and run.node_type:
            startup = max(0.0, run.runtime_s - trainer.steps * run.step_time_s)
            self._measured[run.node_type].append(
                Measured(trainer.model, trainer.plan, run.step_time_s, startup)
            )
            self._calibrations.pop(run.node_type, None)

    def calibration(self, node: NodeType) -> Calibration | None:
        """The step-time model for `node`, once enough of its runs were recorded."""
        runs = self._measured.get(node.name, [])
        if len(runs) < MIN_CALIBRATION_RUNS:
            return None
        if node.name not in self._calibrations:
            self._calibrations[node.name] = calibrate(node, runs)
        return self._calibrations[node.name]

    def gpu_speeds(self, nodes: Sequence[Node]) -> dict[str, float]:
        """Each GPU type's speed (by `Node.gpu_type_key`): from the calibrated step-time
        model of its nodes where this cluster has measured them (the reference
        workload's step time against the other types'), else the seed table."""
        shapes = frozenset((n.gpu_type_key, n.num_gpus, int(n.num_cpus)) for n in nodes)
        key = (shapes, self._learned)
        if self._speeds is None or self._speeds[0] != key:
            self.refresh()
            types: dict[str, list[NodeType]] = {}
            for node in nodes:
                if node.num_gpus:
                    types.setdefault(node.gpu_type_key, []).append(node_type(node))
            steps = {
                name: calibration.step_time_s(REFERENCE_MODEL, REFERENCE_PLAN)
                for name, kinds in types.items()
                if name and (calibration := self._first_calibrated(kinds)) is not None
            }
            measured = measured_speeds(steps)
            self._speeds = ((shapes, self._learned), speeds_for(types, measured))
        return self._speeds[1]

    def _first_calibrated(self, kinds: Sequence[NodeType]) -> Calibration | None:
        """The step-time model of the first of these node shapes that has one."""
        for kind in dict.fromkeys(kinds):
            calibration = self.calibration(kind)
            if calibration is not None:
                return calibration
        return None

    def planning_calibration(self, node: NodeType) -> Calibration:
        """The fitted model for `node`, else the one at assumed speeds: what `auto`
        compares plans with (a ranking the assumed speeds get right far more often than
        a run time)."""
        return self.calibration(node) or assumed(node)

    # -- the loop's side ----------------------------------------------------------------

    def views(
        self,
        jobs: Sequence[JobRecord],
        working: WorkingSet,
        nodes: Sequence[Node],
        now: datetime,
    ) -> list[JobView]:
        """The jobs' views (`jobs` as `working` last loaded them) with each one's predicted
        remaining run time. The last pass's list while nothing it read has moved: no
        record (`working.revision`), no finished run learned, the same node type, and no
        holding job due to be predicted anew."""
        if working.generation != self._refreshed_at:  # no job left the set: none finished
            self.refresh()
            self._refreshed_at = working.generation
        common = common_node_type(nodes)
        inputs = (working.revision, self._learned, common)
        last = self._last_views
        self._views_reused = last is not None and last[0] == inputs and now < last[1]
        if last is not None and self._views_reused:
            return last[2]
        by_id = {n.id: n for n in nodes}
        self._current = {job.id: self._predict_cached(job, by_id, common, now) for job in jobs}
        self._pending = {job.id for job in jobs if job.state is JobState.PENDING}
        if len(self._kept) > len(self._current):  # some job left (the rest are all kept)
            self._kept = {j: kept for j, kept in self._kept.items() if j in self._current}
            self._trainers = {k: t for k, t in self._trainers.items() if k[0] in self._current}
        self._views = {job.id: self._with_prediction(working.view(job)) for job in jobs}
        out = [view for _, view in self._views.values()]
        holding = (job.id for job in jobs if job.state in RESOURCE_HOLDING_STATES)
        predicted_at = (self._kept[job_id][1] for job_id in holding)
        due = min(predicted_at, default=now) + timedelta(seconds=REPREDICT_RUNNING_S)
        self._last_views = (inputs, due, out)
        return out

    def _with_prediction(self, view: JobView) -> tuple[JobView, JobView]:
        """(the view, it with its prediction); the last pass's pair when neither moved. A
        prediction at assumed speeds is not the core's to act on: unknown to it."""
        current = self._current[view.id]
        remaining = None if current.assumed else current.remaining_s
        last = self._views.get(view.id)
        if last is None or last[0] is not view or last[1].predicted_remaining_s != remaining:
            last = (view, replace(view, predicted_remaining_s=remaining))
        return last

    def record(self, decisions: Sequence[Decision], now: datetime) -> None:
        """Store what changed since last written; a waiting job's end is its estimated
        start (now, for one this pass admits) plus its predicted run time."""
        starts = {d.job_id: d.estimated_start_at for d in decisions if isinstance(d, Wait)}
        starts.update({d.job_id: now for d in decisions if isinstance(d, Admit)})
        if self._views_reused and starts == self._last_starts:
            return  # every prediction and start as the last pass recorded them
        self._last_starts = starts
        unseen = [job_id for job_id in self._current if job_id not in self._written]
        self._written.update(self._repo.predictions(unseen))
        changed = []
        for job_id, current in self._current.items():
            start = starts.get(job_id)
            last = self._recorded.get(job_id)
            if last is not None and last[0] is current and last[1] == start:
                continue  # what the last pass compared (a waiting job's kept prediction)
            self._recorded[job_id] = (current, start)
            p = ending(current, start)
            if moved(self._written.get(job_id), p):
                changed.append((job_id, p))
                self._written[job_id] = p
        if changed:
            self._repo.record_predictions(changed, pending=self._pending)
        self._written = {j: p for j, p in self._written.items() if j in self._current}
        self._recorded = {j: r for j, r in self._recorded.items() if j in self._current}

    # -- one job ------------------------------------------------------------------------

    def _predict_cached(
        self, job: JobRecord, nodes: Mapping[str, Node], common: NodeType | None, now: datetime
    ) -> JobPrediction:
        """`predict_record`, kept until the job's row, the history or the node type moves;
        for a job holding resources (whose prediction moves with the clock) at most
        `REPREDICT_RUNNING_S`: thousands of running gangs need not be predicted anew
        every pass, and a prediction is only rewritten when it moves by 2% anyway."""
        holding = job.state in RESOURCE_HOLDING_STATES
        # A waiting job's prediction reads only what never changes (spec, queue, user,
        # name); a holding job's reads its row (progress, placement).
        key = (job.version if holding else -1, self._learned, common.name if common else None)
        kept = self._kept.get(job.id)
        if (
            kept is None
            or kept[0] != key
            or (holding and (now - kept[1]).total_seconds() >= REPREDICT_RUNNING_S)
        ):
            kept = self._kept[job.id] = (key, now, self.predict_record(job, nodes, common, now))
        return kept[2]

    def _trainer(self, job: JobRecord, dp: int) -> TrainerJob | None:
        if (job.id, dp) not in self._trainers:
            self._trainers[job.id, dp] = trainer_job(job.spec, dp)
        return self._trainers[job.id, dp]

    def predict_record(
        self,
        job: JobRecord,
        nodes: Mapping[str, Node],
        common: NodeType | None,
        now: datetime,
    ) -> JobPrediction:
        holding = job.state in RESOURCE_HOLDING_STATES and job.started_at is not None
        elapsed_s = (now - job.started_at).total_seconds() if holding and job.started_at else 0.0
        placed = job.spec.placed(job.placement)
        first = nodes.get(job.placement[0]) if job.placement else None
        node = node_type(first) if first else common
        trainer = self._trainer(job, placed.parallelism.dp)
        measured = _measured_step_s(job) if holding else None
        if trainer and measured is not None:
            left = max(0, (job.total_steps or trainer.steps) - job.step)
            remaining = left * measured
            basis = f"{measured:.3f} s/step measured over {job.step} steps, {left} steps left"
            prediction = JobPrediction(
                elapsed_s + remaining, remaining, None, None, "steps", basis, measured
            )
        else:
            features = _features(job.queue, job.user, job.name, placed.num_gpus)
            prediction = self.predict_new(job.spec, features, node, elapsed_s, trainer)
        if node is not None:
            prediction = replace(prediction, node_type=node.name)
        if holding and prediction.remaining_s is not None:
            end = now + timedelta(seconds=prediction.remaining_s)
            prediction = replace(prediction, estimated_end_at=end)
        return prediction

    def predict_new(
        self,
        spec: JobSpec,
        features: JobFeatures,
        node: NodeType | None,
        elapsed_s: float = 0.0,
        trainer: TrainerJob | None = None,
    ) -> JobPrediction:
        """A job's run time from the step-time model (trainers on a calibrated node type)
        else from similar finished jobs; `elapsed_s` already run."""
        trainer = trainer or trainer_job(spec)
        calibration = self.calibration(node) if node else None
        if trainer and calibration:
            return _modelled(calibration, trainer, elapsed_s)
        history = self._history.predict(features, elapsed_s)
        if history.runtime_s is not None:
            remaining = max(0.0, history.runtime_s - elapsed_s)
            return JobPrediction(
                history.runtime_s,
                remaining,
                history.low_s,
                history.high_s,
                "history",
                history.basis,
            )
        if trainer and node:
            return _modelled(assumed(node), trainer, elapsed_s)
        return JobPrediction(None, None, None, None, "unknown", history.basis)


def _modelled(calibration: Calibration, trainer: TrainerJob, elapsed_s: float) -> JobPrediction:
    """The step-time model's run time, its low/high at its expected error (none when
    that is unknown)."""
    step_s = calibration.step_time_s(trainer.model, trainer.plan)
    total = job_time_s(calibration, trainer.model, trainer.plan, trainer.steps)
    basis = f"{calibration.describe()}: {step_s:.3f} s/step x {trainer.steps} steps + start-up"
    error = calibration.expected_error
    low, high = (total * (1 - error), total * (1 + error)) if error is not None else (None, None)
    remaining = max(0.0, total - elapsed_s)
    return JobPrediction(
        total, remaining, low, high, "model", basis, step_s, assumed=not calibration.runs
    )


def _features(queue: str, user: str, name: str, num_gpus: int) -> JobFeatures:
    return JobFeatures(queue=queue, user=user, name=name, num_gpus=num_gpus)


def _measured_step_s(job: JobRecord) -> float | None:
    """Mean seconds per step of this attempt so far (start-up included: it is paid)."""
    if job.step <= 0 or job.progress_at is None or job.started_at is None:
        return None
    return max(0.0, (job.progress_at - job.started_at).total_seconds()) / job.step
