"""A running gang's lifecycle as a pure function: what the loop should do next.

`next_transition(job, status, now, config)` reads one job as the store holds it and what
its gang reports, and answers with the state change the loop should make (or None): a
start, a completion, a failure or a restart within the budget, a hang, the time limit, and
the end of a preemption or a resize. It does no I/O, so every rule is tested as a table
(tests/unit/test_lifecycle.py) without a database or Ray; the loop applies the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from scheduler.model import BuiltinEntrypoint, JobState
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus, last_line
from scheduler.runtime.views import run_info
from scheduler.store import JobRecord

# Observed for progress, completion and failure: the gang is (about to be) running.
_OBSERVED_STATES = frozenset({JobState.ADMITTED, JobState.STARTING, JobState.RUNNING})


@dataclass(frozen=True)
class LifecycleConfig:
    """A running job whose step has not moved for `hang_factor` x its step time (and at
    least `hang_min_s`) is hung: its stacks are kept and it is restarted.

    `start_timeout_s` bounds what has no step time to go by: a gang still STARTING this
    long after its admission (a rank fetching its package, setting up its sandbox or
    loading the program without end, a supervisor that never answers), and a running
    attempt of the built-in trainer (it reports every step) with no step this long after
    its ranks started. Either is a hang, handled as one: stacks kept, restarted within
    `max_restarts`. Without it such a gang holds its GPUs for ever. A function, script
    or command may never report a step, so its first step is not awaited. Longer than
    the supervisor's own limit on a requirement install
    (`workers.supervisor.venvs.INSTALL_TIMEOUT_S`, 1800 s), which fails the rank with
    pip's output first, and than Ray's placement timeout, which requeues the job."""

    hang_factor: float = 10.0
    hang_min_s: float = 300.0
    start_timeout_s: float = 3600.0


@dataclass(frozen=True)
class Transition:
    """One state change for the loop to write, with what must happen around it.

    `release`: let go of the gang first. `with_stacks`: put every rank's stacks before the
    error (a hang). `suspect_nodes`: nodes where ranks were lost. `lost_steps`: steps the
    next attempt does again. `then`: a second change right after (RESTARTING -> PENDING).
    `relaunch`: the new state is ADMITTED again, so the next attempt is launched."""

    to: JobState
    reason: str
    fields: Mapping[str, object] = field(default_factory=dict)
    release: bool = True
    with_stacks: bool = False
    suspect_nodes: tuple[str, ...] = ()
    lost_steps: int = 0
    then: Transition | None = None
    relaunch: bool = False


def next_transition(
    job: JobRecord, status: GroupStatus, now: datetime, config: LifecycleConfig
) -> Transition | None:
    """The change the gang's report calls for, or None while nothing changes."""
    if job.state is JobState.PREEMPTING:
        return _preempting(job, status, now)
    if job.state is JobState.RESIZING:
        return _resizing(job, status, now)
    if job.state in _OBSERVED_STATES:
        return _observed(job, status, now, config)
    return None


def _observed(
    job: JobRecord, status: GroupStatus, now: datetime, config: LifecycleConfig
) -> Transition | None:
    if status.ranks_started and job.state is JobState.STARTING:
        ranks = len(job.placement or ())
        return Transition(JobState.RUNNING, f"all {ranks} ranks started", release=False)
    return _ended(job, status) or _overrun(job, status, now, config)


def _ended(job: JobRecord, status: GroupStatus) -> Transition | None:
    """The gang exited, or never got its placement."""
    if status.phase is GroupPhase.SUCCEEDED and _paused(job, status):
        step = status.step
        return Transition(
            JobState.PENDING,
            f"paused at step {step} (its pause_at) with a checkpoint; held until released",
            {"placement": None, "hold": f"paused at step {step}: waits to be released"},
        )
    if status.phase is GroupPhase.SUCCEEDED:
        return Transition(JobState.SUCCEEDED, f"all ranks finished at step {status.step}")
    if status.phase is GroupPhase.FAILED:
        failed = fail_or_restart(job, status.error or "the gang failed", status)
        return replace(failed, suspect_nodes=tuple(status.lost_nodes))
    if status.phase is GroupPhase.PLACEMENT_TIMEOUT:
        reason = status.error or "placement timed out"
        return Transition(JobState.PENDING, reason, {"placement": None})
    return None


def _paused(job: JobRecord, status: GroupStatus) -> bool:
    """The built-in trainer stopped at one of its `pause_at` steps, before its last."""
    entry = job.spec.entrypoint
    if not isinstance(entry, BuiltinEntrypoint) or job.total_steps is None:
        return False
    return status.step < job.total_steps and status.step in entry.settings.get("pause_at", ())


def _overrun(
    job: JobRecord, status: GroupStatus, now: datetime, config: LifecycleConfig
) -> Transition | None:
    """The gang runs on but must stop: it hangs, or it is past its time limit."""
    if (hang := _hang(job, status, now, config)) is not None:
        return replace(fail_or_restart(job, hang, status), with_stacks=True)
    if _over_time_limit(job, now):
        reason = f"time limit of {job.spec.time_limit_s:g} s exceeded"
        return Transition(JobState.FAILED, reason, {"error": "time limit exceeded"})
    return None


def _preempting(job: JobRecord, status: GroupStatus, now: datetime) -> Transition | None:
    """Requeued once the ranks have stopped, or at the deadline (then they are killed)."""
    if (finished := _finished_while_stopping(job, status)) is not None:
        return finished
    stopped = _stopped(job, status, now)
    if stopped is None:
        return None
    where, resume = stopped
    return Transition(
        JobState.PENDING,
        f"{where} and requeued; {resume}",
        {"placement": None, "preempt_deadline": None},
        lost_steps=lost_steps(status),
    )


def _resizing(job: JobRecord, status: GroupStatus, now: datetime) -> Transition | None:
    """Relaunched at the new placement once the ranks have saved and exited (or at the
    deadline, from the checkpoint before). A rank that crashed is a failure."""
    if status.phase is GroupPhase.FAILED:
        return fail_or_restart(job, status.error or "the gang failed while resizing", status)
    if (finished := _finished_while_stopping(job, status)) is not None:
        return finished
    stopped = _stopped(job, status, now)
    if stopped is None:
        return None
    return relaunch(job, "; ".join(stopped), lost=lost_steps(status))


# What the last attempt measured of its own gang (its error, stragglers, checkpoint, step
# time and throughput), cleared whenever a next attempt starts (an admission or a
# resize's relaunch, whose gang has another size): one list, so the two cannot drift
# apart. The step and loss describe the model, so a relaunch keeps them.
NEW_ATTEMPT: Mapping[str, None] = MappingProxyType(
    {
        "error": None,
        "stragglers": None,
        "checkpoint_step": None,
        "step_time_s": None,
        "tokens_per_s": None,
    }
)


def relaunch(job: JobRecord, why: str, *, lost: int = 0) -> Transition:
    """A resized job's next attempt, on the placement the store already holds."""
    dp = job.spec.placed(job.placement).parallelism.dp
    return Transition(
        JobState.ADMITTED,
        f"{why}; relaunching at dp={dp}",
        {
            "attempt": job.attempt + 1,
            "preempt_deadline": None,
            **NEW_ATTEMPT,
        },
        lost_steps=lost,
        relaunch=True,
    )


def fail_or_restart(job: JobRecord, error: str, status: GroupStatus) -> Transition:
    """FAILED once the restart budget is spent, else RESTARTING then PENDING."""
    max_restarts = job.spec.max_restarts
    headline = status.reason or last_line(error) or "the gang failed"
    if job.restarts >= max_restarts:
        reason = f"failed after {job.restarts} restart(s): {headline}"
        return Transition(JobState.FAILED, reason, {"error": error})
    return Transition(
        JobState.RESTARTING,
        f"restart {job.restarts + 1} of {max_restarts}: {headline}",
        {"restarts": job.restarts + 1, "error": error},
        lost_steps=lost_steps(status),
        then=Transition(JobState.PENDING, "requeued to be placed again", release=False),
    )


def lost_steps(status: GroupStatus) -> int:
    """Steps done since the newest checkpoint: the next attempt does them again."""
    return max(0, status.step - (status.checkpoint_step or 0))


def _finished_while_stopping(job: JobRecord, status: GroupStatus) -> Transition | None:
    """A gang told to stop that finished its work meanwhile simply succeeded: it reached
    its last step, or (no step count: a function or script) its entrypoint returned
    without ever being told to stop. Requeued, it would run its work twice."""
    if job.total_steps is not None:
        finished = status.step >= job.total_steps
    else:
        finished = not status.stop_seen
    if status.phase is GroupPhase.SUCCEEDED and finished:
        return Transition(JobState.SUCCEEDED, f"finished at step {status.step} while stopping")
    return None


def _stopped(job: JobRecord, status: GroupStatus, now: datetime) -> tuple[str, str] | None:
    """For a gang sent the stop notice: None while it may still stop on its own;
    otherwise where it stopped and what it resumes from."""
    exited = status.phase in (GroupPhase.SUCCEEDED, GroupPhase.FAILED)
    deadline = job.preempt_deadline
    if not exited and (deadline is None or now < deadline):
        return None
    lost = lost_steps(status)
    how = (
        f"stopped at step {status.step}"
        if exited
        else f"killed at the deadline at step {status.step}"
    )
    if exited and status.stop_ack_s is not None:
        how += f" ({status.stop_ack_s:.1f} s after the notice)"
    saved = status.checkpoint_step
    resume = (
        f"resumes from its checkpoint at step {saved} ({lost} steps lost)"
        if saved is not None
        else f"no checkpoint, so it restarts from step 0 ({lost} steps lost)"
    )
    return how, resume


def quiet_until(job: JobRecord, status: GroupStatus, config: LifecycleConfig) -> datetime | None:
    """For a report `next_transition` answered None: the moment it may answer otherwise
    with the same job row and the same report, or None if it never will. Only three
    rules read the clock (the hang rule, the time limit, a stop notice's deadline), so a
    loop polling thousands of quiet gangs need not judge each one on every pass."""
    if job.state in (JobState.PREEMPTING, JobState.RESIZING):
        return job.preempt_deadline
    hang = _hang_limit(job, status, config)
    moments = [m for m in (hang.at if hang else None, _time_limit_at(job)) if m is not None]
    return min(moments, default=None)


@dataclass(frozen=True)
class _HangLimit:
    silent_s: float  # the limit on seconds without a step
    since: datetime  # what the silence counts from
    why: str  # how the limit was set, for the reason

    @property
    def at(self) -> datetime:
        return self.since + timedelta(seconds=self.silent_s)


def _hang_limit(job: JobRecord, status: GroupStatus, config: LifecycleConfig) -> _HangLimit | None:
    """How long the job may go without a step (or, starting, without its ranks ready).
    A running job that has stepped in this attempt goes by its step time; the built-in
    trainer before its first step gets `start_timeout_s` from its ranks' start (start-up
    and checkpoint loading have no step time to go by); a starting gang gets
    `start_timeout_s` from its admission."""
    if job.state is JobState.STARTING and job.admitted_at is not None:
        why = f"start timeout {config.start_timeout_s:.0f} s from admission"
        return _HangLimit(config.start_timeout_s, job.admitted_at, why)
    run = run_info(job)
    if job.state is not JobState.RUNNING or status.step != job.step or run is None:
        return None
    stepped_at = job.progress_at
    if stepped_at is not None and stepped_at >= run.started_at and run.step_time_s is not None:
        limit = max(config.hang_min_s, config.hang_factor * run.step_time_s)
        why = (
            f"max({config.hang_min_s:.0f} s, {config.hang_factor:g} x step time "
            f"{run.step_time_s:.2f} s)"
        )
        return _HangLimit(limit, stepped_at, why)
    if job.total_steps is not None:  # the built-in trainer: it reports every step
        return _HangLimit(config.start_timeout_s, run.started_at, "the start timeout")
    return None


def _hang(
    job: JobRecord, status: GroupStatus, now: datetime, config: LifecycleConfig
) -> str | None:
    """Why the job counts as hung, or None."""
    limit = _hang_limit(job, status, config)
    if limit is None or now <= limit.at:
        return None
    silent = (now - limit.since).total_seconds()
    if job.state is JobState.STARTING and status.phase is GroupPhase.PLACING:
        return (
            f"hung while starting: Ray had not reserved its placement {silent:.0f} s "
            f"after admission (limit: {limit.why})"
        )
    if job.state is JobState.STARTING:
        return (
            f"hung while starting: not every rank ready {silent:.0f} s after admission "
            f"(limit: {limit.why}); every rank's stacks are above"
        )
    return (
        f"hung: no progress past step {job.step} for {silent:.0f} s (limit "
        f"{limit.silent_s:.0f} s = {limit.why}); every rank's stacks are above"
    )


def _time_limit_at(job: JobRecord) -> datetime | None:
    """When a running job's time limit runs out (None: it has none, or is not running)."""
    limit = job.spec.time_limit_s
    if limit is None or job.started_at is None or job.state is not JobState.RUNNING:
        return None
    return job.started_at + timedelta(seconds=limit)


def _over_time_limit(job: JobRecord, now: datetime) -> bool:
    at = _time_limit_at(job)
    return at is not None and now > at
