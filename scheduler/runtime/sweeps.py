"""The loop's step for sweeps: each pass, every running sweep is brought up to date and
moved on (`SweepController.advance`).

1. Each trial's job is read: a job that succeeded completes its trial (its final objective
   recorded); one that failed or was cancelled by someone else fails it; a running one that
   passed its rung's step has its objective there recorded (the newest report of the
   objective metric at or before that step).
2. The pure rule (`core.asha.advance`) says which trials go on, pause, are promoted or
   stopped, how many new ones start, and whether the sweep is done.
3. Those are applied: a pause stops the gang with its checkpoint and holds the job (the
   scheduler's own preemption), a promotion releases the hold (it resumes from the
   checkpoint), a new trial is asked of the searcher and written with its job in one
   transaction, a stop cancels the held job.

Everything it knows is in the store, so a restarted service or a new leader carries on
where the last pass left off; a trial is never made twice (its number is a key).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from gangway.models import Builtin, JobSubmit, SweepSubmit, submit_body
from scheduler.core.asha import (
    Budget,
    Continue,
    Finish,
    Pause,
    Promote,
    Rungs,
    Start,
    Stop,
    TrialState,
    TrialView,
    advance,
    go_on_bars,
    places,
)
from scheduler.model import BUILTIN_OBJECTIVE, Condition, JobState
from scheduler.runtime.applier import Applier
from scheduler.runtime.searchers import suggest, trial_budget
from scheduler.store import (
    Fenced,
    IllegalTransition,
    JobEnded,
    JobRecord,
    JobRepository,
    QueueRepository,
    StaleState,
)
from scheduler.store.records import new_job
from scheduler.store.sweeps import SweepRecord, SweepState, TrialRecord

log = logging.getLogger(__name__)

Bars = Mapping[int, float | None]  # rung -> the value a trial must beat to go on there

MAX_FAILED_PASSES = 3


class TrialRefused(ValueError):
    """The searcher's next trial is not a valid job: the sweep cannot go on."""


def upstream_of(trial: JobSubmit) -> tuple[tuple[int, Condition], ...]:
    """The jobs a trial waits for, by the rule its base was checked by at submit
    (`JobSubmit.named_upstream`; job ids only: a sweep is not a pipeline)."""
    pairs: dict[int, Condition] = {}
    for named in trial.named_upstream():
        pairs.setdefault(int(named.job), Condition(named.on))
    return tuple(pairs.items())


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep's stored request means for the controller."""

    request: SweepSubmit
    rungs: Rungs | None
    budget: Budget
    metric: str
    minimize: bool

    @property
    def rung_steps(self) -> tuple[int, ...]:
        return self.rungs.steps if self.rungs else ()

    def bracket_of(self, number: int) -> int:
        return self.rungs.bracket_of(number) if self.rungs else 0


def sweep_plan(spec: Mapping[str, Any]) -> SweepPlan:
    request = SweepSubmit.model_validate(spec, context={"stored": True})
    objective = request.objective
    metric, mode = (
        (objective.metric, objective.mode)
        if objective
        else (BUILTIN_OBJECTIVE.metric, BUILTIN_OBJECTIVE.mode)
    )
    return SweepPlan(
        request=request,
        rungs=rungs_of(request),
        budget=Budget(trial_budget(request), request.max_concurrent),
        metric=metric,
        minimize=mode == "min",
    )


def rungs_of(request: SweepSubmit) -> Rungs | None:
    """ASHA's rungs: up to the trial's budget (the built-in trainer's steps unless the
    rule names one), from `min_steps` (default: three rungs)."""
    rule = request.early_stopping
    if rule is None:
        return None
    entry = request.base.entrypoint
    budget = rule.max_steps or (entry.steps if isinstance(entry, Builtin) else None)
    if budget is None:
        raise ValueError("early stopping needs max_steps for a job that is not the built-in")
    first = min(rule.min_steps or max(1, budget // rule.reduction_factor**2), budget)
    rungs = Rungs(first, rule.reduction_factor, budget)
    return replace(rungs, brackets=len(rungs.steps)) if rule.rule == "hyperband" else rungs


def trial_body(
    plan: SweepPlan, number: int, params: Mapping[str, Any], bars: Bars
) -> dict[str, Any]:
    """The base job with the trial's parameters at their paths; the built-in trainer
    validates at every rung of its bracket (the rungs are multiples of the first) and
    stops at each but the last, held, for the sweep to release or keep, unless its value
    there beats the rung's bar (`with_bars`, as the values stood when the trial was
    made: a job's spec never changes); other jobs are paused by the scheduler's
    preemption once they pass a rung."""
    body = submit_body(plan.request.base)
    for path, value in params.items():
        set_path(body, path, value)
    body["name"] = f"{plan.request.name}-{number}"
    if body["entrypoint"]["kind"] == "builtin" and plan.rungs is not None:
        first = plan.bracket_of(number)
        body["entrypoint"]["pause_at"] = list(plan.rung_steps[first:-1])
        body["entrypoint"]["eval_every"] = plan.rung_steps[first]
    # A job that may not be preempted cannot be paused once it went on past a rung on a
    # bar gone stale: it stops at every rung and waits for the sweep's word.
    return with_bars(body, plan, bars if body.get("preemptible", True) else {})


def with_bars(body: Mapping[str, Any], plan: SweepPlan, bars: Bars) -> dict[str, Any]:
    """The job body with the built-in trainer's `pause_unless` set from `bars` (rung ->
    value to beat); other entrypoints have no pause points and are returned as they are."""
    entry = body["entrypoint"]
    if entry["kind"] != "builtin":
        return dict(body)
    mode = "min" if plan.minimize else "max"
    pause_unless = [
        {"step": plan.rung_steps[rung], "metric": plan.metric, "mode": mode, "better_than": bar}
        for rung, bar in sorted(bars.items())
    ]
    return {**body, "entrypoint": {**entry, "pause_unless": pause_unless}}


def set_path(body: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path (keys, or list indices) in a job body; KeyError/IndexError where
    the base body has nothing there (the API checks every path at submit)."""
    *parents, last = path.split(".")
    node: Any = body
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    elif isinstance(node, dict) and (last in node or parents[:1] == ["env"]):
        node[last] = value
    else:
        raise KeyError(path)


def _passed_its_rung(trial: TrialRecord, job: JobRecord, steps: tuple[int, ...]) -> bool:
    """A running trial whose job is past the rung it works toward, not yet recorded, and
    in a state a pause applies to (running, or pending): one between states (starting,
    stopping) is recorded on a later pass, so the rule never decides a pause that cannot
    be carried out (and frees its slot for a new trial meanwhile)."""
    rung = trial.rung
    running = trial.state is TrialState.RUNNING and rung < len(steps)
    settled = job.state in (JobState.RUNNING, JobState.PENDING)
    return running and settled and rung not in trial.values and job.step >= steps[rung]


def _rungs_passed(trial: TrialRecord, job: JobRecord, steps: tuple[int, ...]) -> list[int]:
    """The rungs before the last, from the one the trial works toward, that its job's
    step has reached and the trial has no value for yet."""
    return [
        r
        for r in range(trial.rung, len(steps) - 1)
        if steps[r] <= job.step and r not in trial.values
    ]


def _held_behind(trial: TrialRecord, job: JobRecord, steps: tuple[int, ...]) -> bool:
    """The trainer stopped at a rung the sweep had already let the trial pass (it went
    on while the last report was on its way): nothing is left to decide there."""
    if trial.state is not TrialState.RUNNING or job.state is not JobState.PENDING:
        return False
    return job.hold is not None and trial.rung < len(steps) and job.step < steps[trial.rung]


class SweepController:
    def __init__(
        self,
        repo: JobRepository,
        applier: Applier,
        clock: Callable[[], datetime],
    ) -> None:
        self._repo, self._applier, self._clock = repo, applier, clock
        self._queues = QueueRepository(repo.engine)
        self._plans: dict[int, SweepPlan] = {}
        self._failures: dict[int, int] = {}  # sweep id -> passes in a row that raised
        # job id -> how readily to preempt it (`JobView.expendable`): running trials by
        # their place at their latest rung, as of the last pass.
        self.expendable: dict[int, float] = {}

    def advance(self) -> None:
        """Bring every running sweep up to date and move it on (one query when none)."""
        sweeps = self._repo.running_sweeps()
        self.expendable = {}
        for sweep in sweeps:
            try:
                self._advance(sweep)
                self._failures.pop(sweep.id, None)
            except (StaleState, IllegalTransition, JobEnded) as exc:  # a user moved a job
                log.info("sweep %s: %s; trying again next pass", sweep.id, exc)
            except Fenced:
                raise
            except TrialRefused as exc:
                self._end(sweep, str(exc))
            except Exception as exc:  # one sweep's fault never stops the loop for all
                self._failed(sweep, exc)
        if len(self._plans) > len(sweeps):
            running = {s.id for s in sweeps}
            self._plans = {i: p for i, p in self._plans.items() if i in running}

    def _failed(self, sweep: SweepRecord, exc: Exception) -> None:
        """Log a pass that raised; after `MAX_FAILED_PASSES` in a row, end the sweep."""
        log.exception("sweep %s: pass failed", sweep.id)
        count = self._failures[sweep.id] = self._failures.get(sweep.id, 0) + 1
        if count >= MAX_FAILED_PASSES:
            self._end(sweep, f"{count} passes in a row failed: {type(exc).__name__}: {exc}")

    def _end(self, sweep: SweepRecord, reason: str) -> None:
        """End the sweep FAILED and stop its trials that have not ended."""
        self._failures.pop(sweep.id, None)
        if not self._repo.end_sweep(sweep.id, SweepState.FAILED, reason):
            return
        jobs = {j.id: j for j in self._repo.many(t.job_id for t in sweep.trials)}
        for trial in sweep.trials:
            if not trial.state.ended:
                self._stop(sweep, trial, jobs, reason)

    def _plan(self, sweep: SweepRecord) -> SweepPlan:
        plan = self._plans.get(sweep.id)
        if plan is None:
            plan = self._plans[sweep.id] = sweep_plan(sweep.spec)
        return plan

    def _advance(self, sweep: SweepRecord) -> None:
        plan = self._plan(sweep)
        jobs = {j.id: j for j in self._repo.many(t.job_id for t in sweep.trials)}
        trials = [self._observed(sweep.id, plan, t, jobs[t.job_id]) for t in sweep.trials]
        views = _views(plan, trials)
        by_number = {t.number: t for t in trials}
        self.expendable |= {
            by_number[number].job_id: place
            for number, place in places(views, minimize=plan.minimize).items()
        }
        for action in advance(views, plan.rungs, plan.budget, minimize=plan.minimize):
            if isinstance(action, Continue):
                self._go_on(sweep, by_number[action.number], jobs, action)
            elif isinstance(action, Pause):
                self._pause(sweep, plan, by_number[action.number], jobs, action)
            elif isinstance(action, Promote):
                self._promote(sweep, by_number[action.number], jobs, action)
            elif isinstance(action, Start):
                started = self._start(sweep, plan, trials)
                if started is None:
                    return  # the sweep ended meanwhile (cancelled)
                trials.append(started)
            elif isinstance(action, Stop):
                self._stop(sweep, by_number[action.number], jobs, action.reason)
            else:
                assert isinstance(action, Finish)
                self._repo.end_sweep(sweep.id, SweepState.SUCCEEDED, action.reason)

    # -- step 1: what the trials' jobs did -----------------------------------------------

    def _observed(
        self, sweep_id: int, plan: SweepPlan, trial: TrialRecord, job: JobRecord
    ) -> TrialRecord:
        """The trial with what its job did since the last pass written."""
        if trial.state.ended:
            return trial
        values = dict(trial.values)
        state, rung = trial.state, trial.rung
        steps = plan.rung_steps
        if job.state is JobState.SUCCEEDED:
            values |= self._values_at(job, plan, _rungs_passed(trial, job, steps))
            final = self._repo.latest_value(job.id, plan.metric, job.step)
            if final is not None:
                values[len(steps) - 1 if steps else 0] = final
            state, rung = TrialState.COMPLETED, max(len(steps) - 1, 0)
        elif job.state.is_terminal:
            state = TrialState.FAILED
        elif _passed_its_rung(trial, job, steps):
            # every rung it passed since the last pass (a trainer that beat its bars, a
            # pass that came late), so the board has each of its values
            values |= self._values_at(job, plan, _rungs_passed(trial, job, steps))
            if rung not in values and job.hold is not None:  # stopped without the objective
                state = TrialState.FAILED
                self._cancel(
                    job, f"sweep {sweep_id}: reported no {plan.metric} by step {steps[rung]}"
                )
        if _held_behind(trial, job, steps):
            reason = f"sweep {sweep_id} already let it past step {job.step}: resumes"
            self._repo.annotate(job.id, reason, hold=None, queued_at=self._clock())
        if (state, rung, values) == (trial.state, trial.rung, trial.values):
            return trial
        self._repo.update_trial(sweep_id, trial.number, state=state, rung=rung, values=values)
        return TrialRecord(trial.number, trial.job_id, trial.params, state, rung, values)

    def _values_at(self, job: JobRecord, plan: SweepPlan, rungs: list[int]) -> dict[int, float]:
        """The objective the job reported at or before each of these rungs' steps."""
        found = {r: self._repo.latest_value(job.id, plan.metric, plan.rung_steps[r]) for r in rungs}
        return {r: v for r, v in found.items() if v is not None}

    def _cancel(self, job: JobRecord, reason: str) -> None:
        if not job.state.is_terminal:
            with contextlib.suppress(StaleState, IllegalTransition):
                self._repo.transition(job.id, JobState.CANCELLED, reason=reason)

    # -- step 3: acting on the rule -------------------------------------------------------

    def _pause(
        self,
        sweep: SweepRecord,
        plan: SweepPlan,
        trial: TrialRecord,
        jobs: Mapping[int, JobRecord],
        action: Pause,
    ) -> None:
        """Keep the trial held: its trainer stopped at the rung (PENDING, held), or its
        gang is stopped with its checkpoint and held (a job without pause points). A job
        that may not be preempted runs on: the rule asks again next pass."""
        job = jobs[trial.job_id]
        value = trial.values[action.rung]
        hold = f"trial {trial.number} of sweep {sweep.id}: {action.reason}"
        reason = f"paused by sweep {sweep.id} ({plan.metric} {value:.6g}): {action.reason}"
        if job.state is JobState.RUNNING and job.spec.preemptible:
            self._applier.pause(job, hold, reason)
        elif job.state is JobState.PENDING:
            self._repo.annotate(job.id, reason, hold=hold)
        else:
            return
        self._repo.update_trial(sweep.id, trial.number, state=TrialState.PAUSED)

    def _go_on(
        self,
        sweep: SweepRecord,
        trial: TrialRecord,
        jobs: Mapping[int, JobRecord],
        action: Continue,
    ) -> None:
        """A trial in the top at its rung goes on at once: left running if its trainer
        went on past the rung, released if it stopped there."""
        self._release(sweep, jobs[trial.job_id], action.reason, action.rung)
        self._repo.update_trial(sweep.id, trial.number, rung=action.rung)

    def _promote(
        self, sweep: SweepRecord, trial: TrialRecord, jobs: Mapping[int, JobRecord], action: Promote
    ) -> None:
        """Release the hold: the job resumes from its checkpoint toward the next rung."""
        self._release(sweep, jobs[trial.job_id], action.reason, action.rung)
        self._repo.update_trial(sweep.id, trial.number, state=TrialState.RUNNING, rung=action.rung)

    def _release(self, sweep: SweepRecord, job: JobRecord, why: str, rung: int) -> None:
        """Release a held trial toward `rung`, unless it is held at that rung's step or
        later (it passed more than one rung between two passes): it stays held and the
        next pass judges it where it stopped, rather than restarting it to pause it."""
        steps = self._plan(sweep).rung_steps
        held = job.state is JobState.PENDING and job.hold is not None
        if not held or (rung < len(steps) and job.step >= steps[rung]):
            return
        reason = f"{why} (sweep {sweep.id}); resumes toward rung {rung}"
        self._repo.annotate(job.id, reason, hold=None, queued_at=self._clock())

    def _start(
        self, sweep: SweepRecord, plan: SweepPlan, trials: list[TrialRecord]
    ) -> TrialRecord | None:
        """The next trial and its job, or None if the sweep ended meanwhile. Its body is
        checked as a job first: one the corners checked at submit did not cover (a
        combination) ends the sweep with the reason, as no such job may be stored."""
        number = len(trials)
        params = suggest(plan.request, number, trials, plan.rung_steps)
        bars = (
            go_on_bars(
                _views(plan, trials), plan.rungs, plan.budget, number=number, minimize=plan.minimize
            )
            if plan.rungs is not None
            else {}
        )
        body = trial_body(plan, number, params, bars)
        try:
            checked = JobSubmit.model_validate(body, context={"stored": True})
        except ValidationError as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
            raise TrialRefused(f"trial {number} ({shown}) is not a valid job: {exc}") from exc
        if not self._queues.admits(body["queue"], body["user"]):  # members changed since
            raise TrialRefused(
                f"trial {number}: queue {body['queue']!r} is for its members, and "
                f"{body['user']} is not one now"
            )
        new = new_job(body, depends_on=upstream_of(checked))
        shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
        reason = f"submitted as trial {number} of sweep {sweep.id} ({sweep.name}): {shown}"
        first = plan.bracket_of(number)  # its first rung
        made = self._repo.add_trial(sweep.id, number, params, new, reason, rung=first)
        return made[0] if made is not None else None

    def _stop(
        self, sweep: SweepRecord, trial: TrialRecord, jobs: Mapping[int, JobRecord], reason: str
    ) -> None:
        self._cancel(jobs[trial.job_id], f"stopped by sweep {sweep.id}: {reason}")
        self._repo.update_trial(sweep.id, trial.number, state=TrialState.STOPPED)


def _views(plan: SweepPlan, trials: list[TrialRecord]) -> list[TrialView]:
    return [
        TrialView(t.number, t.state, t.rung, t.values, plan.bracket_of(t.number)) for t in trials
    ]
