"""Jobs that wait for other jobs (Slurm's `--dependency`): when their conditions hold, when
they never can, and what a waiting job is told.

A dependency names an upstream job and a `Condition`. `settle` judges every open one at
once from the upstream jobs' states: a condition that held is met for good (a job that
succeeded stays succeeded; one that started has started); one that can no longer hold
(the upstream FAILED and the job waited for its success) cancels the waiting job, and
that cancellation is itself an upstream outcome, so a chain is cancelled to its end in
one pass, one job at a time. The jobs still waiting are held out of the queue and get a
`Wait` from `dependency_waits`: which job they wait for, in what state, and the earliest
start that job's predicted end allows.

Pure: the states come from the store (through the loop), the predictions from the core's
own views and the pass's decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from scheduler.core.config import PolicyConfig
from scheduler.core.decisions import Admit, Blocker, Decision, Explanation, Wait
from scheduler.core.timeline import expected_end, expected_runtime_s, runtime_known
from scheduler.model import RESOURCE_HOLDING_STATES, Condition, JobState, JobView


@dataclass(frozen=True, slots=True)
class Upstream:
    """A job another waits for, as the store has it now."""

    job_id: int
    condition: Condition
    state: JobState
    started: bool  # it has run (entered RUNNING at least once)


@dataclass(frozen=True, slots=True)
class OpenDependency:
    """One open dependency: the waiting job (and its state) and its upstream."""

    job_id: int
    job_state: JobState
    upstream: Upstream


class Holds(enum.Enum):
    MET = "met"
    WAITING = "waiting"
    NEVER = "never"


def holds(upstream: Upstream) -> Holds:
    """Whether the condition holds, may still hold, or never will."""
    state = upstream.state
    match upstream.condition:
        case Condition.SUCCEEDED:
            if state is JobState.SUCCEEDED:
                return Holds.MET
        case Condition.ENDED:
            if state.is_terminal:
                return Holds.MET
        case Condition.FAILED:
            if state in (JobState.FAILED, JobState.CANCELLED):
                return Holds.MET
        case Condition.STARTED:
            if upstream.started:
                return Holds.MET
    return Holds.NEVER if state.is_terminal else Holds.WAITING


@dataclass(frozen=True, slots=True)
class Settlement:
    met: tuple[tuple[int, int], ...]  # (job, upstream): the condition held, for good
    cancel: tuple[tuple[int, str], ...]  # (job, reason), upstream jobs before their dependents
    closed: tuple[int, ...]  # waiting jobs no longer pending: their dependencies close
    waiting: Mapping[int, tuple[Upstream, ...]]  # held jobs and what they still wait for


_VERB = {
    Condition.SUCCEEDED: "succeed",
    Condition.ENDED: "end",
    Condition.FAILED: "fail",
    Condition.STARTED: "start",
}


def settle(open_dependencies: Iterable[OpenDependency]) -> Settlement:
    """Judge every open dependency. A job cancelled here counts as CANCELLED for the jobs
    that wait for it, so the cascade ends in one call (repeated until nothing changes:
    no order of the jobs is assumed)."""
    by_job: dict[int, list[OpenDependency]] = {}
    for dep in open_dependencies:
        by_job.setdefault(dep.job_id, []).append(dep)
    closed = sorted(j for j, deps in by_job.items() if deps[0].job_state is not JobState.PENDING)
    pending = {j: deps for j, deps in by_job.items() if deps[0].job_state is JobState.PENDING}
    cancelled: dict[int, str] = {}
    changed = True
    while changed:
        changed = False
        for job_id in sorted(pending):
            if job_id in cancelled:
                continue
            for dep in pending[job_id]:
                upstream = _as_settled(dep.upstream, cancelled)
                if holds(upstream) is Holds.NEVER:
                    cancelled[job_id] = _never_reason(upstream)
                    changed = True
                    break
    met: list[tuple[int, int]] = []
    waiting: dict[int, tuple[Upstream, ...]] = {}
    for job_id in sorted(pending):
        if job_id in cancelled:
            continue
        left = []
        for dep in pending[job_id]:
            upstream = _as_settled(dep.upstream, cancelled)
            if holds(upstream) is Holds.MET:
                met.append((job_id, upstream.job_id))
            else:
                left.append(upstream)
        if left:
            waiting[job_id] = tuple(sorted(left, key=lambda u: u.job_id))
    return Settlement(
        met=tuple(met),
        cancel=tuple(sorted(cancelled.items())),
        closed=tuple(closed),
        waiting=waiting,
    )


def _as_settled(upstream: Upstream, cancelled: Mapping[int, str]) -> Upstream:
    if upstream.job_id in cancelled:
        return replace(upstream, state=JobState.CANCELLED)
    return upstream


def _never_reason(upstream: Upstream) -> str:
    how = "without running" if upstream.condition is Condition.STARTED else ""
    ended = f"{upstream.state.value} {how}".strip()
    return (
        f"cancelled: waited for job {upstream.job_id} to {_VERB[upstream.condition]}, "
        f"but it ended {ended}"
    )


# -- what a held job is told -----------------------------------------------------------


def dependency_waits(
    waiting: Mapping[int, Sequence[Upstream]],
    jobs: Mapping[int, JobView],
    decided: Sequence[Decision],
    now: datetime,
    config: PolicyConfig,
) -> list[Wait]:
    """A Wait per held job, in id order (an upstream job before its dependents, so a
    chain's estimates build on each other): blocked by the upstream job expected to
    satisfy its condition last; its earliest start is that moment (None where some
    upstream job has no basis for a prediction)."""
    starts: dict[int, datetime | None] = {}
    admitted: set[int] = set()
    for decision in decided:
        if isinstance(decision, Wait):
            starts[decision.job_id] = decision.estimated_start_at
        elif isinstance(decision, Admit):
            admitted.add(decision.job_id)
            starts[decision.job_id] = now
    waits = []
    for job_id in sorted(waiting):
        timed = [
            (_expected_at(u, jobs.get(u.job_id), starts, now, config), u) for u in waiting[job_id]
        ]
        at, blocking = _last(timed)
        job, upstream = jobs.get(job_id), jobs.get(blocking.job_id)
        starts[job_id] = at
        explanation = Explanation(
            Blocker.DEPENDENCY,
            _message(blocking, upstream.state if upstream else blocking.state, at, now, len(timed)),
            f"starts once job {blocking.job_id} {_does(blocking.condition)}",
            blocking_job_id=blocking.job_id,
        )
        if job is not None:
            waits.append(Wait(job_id, explanation, at))
    return waits


def _expected_at(
    upstream: Upstream,
    job: JobView | None,
    starts: Mapping[int, datetime | None],
    now: datetime,
    config: PolicyConfig,
) -> datetime | None:
    """When the upstream job should satisfy the condition: start or end, as predicted."""
    if job is None:  # neither pending nor holding GPUs (restarting, say): no estimate
        return None
    if job.state in RESOURCE_HOLDING_STATES:
        start: datetime | None = now
        end = expected_end(job, now, config) if runtime_known(job) else None
    else:
        start = starts.get(job.id)
        end = None
        if start is not None and runtime_known(job):
            end = start + timedelta(seconds=expected_runtime_s(job, config))
    return start if upstream.condition is Condition.STARTED else end


def _last(timed: Sequence[tuple[datetime | None, Upstream]]) -> tuple[datetime | None, Upstream]:
    """The upstream job expected last (one with no estimate counts as last)."""
    unknown = [u for at, u in timed if at is None]
    if unknown:
        return None, unknown[0]
    at, upstream = max(timed, key=lambda t: (t[0], t[1].job_id))
    return at, upstream


def _message(
    blocking: Upstream, seen: JobState, at: datetime | None, now: datetime, count: int
) -> str:
    """`seen`: the upstream job's state as this pass loaded it (newer than the state the
    dependency was settled on, read at the start of the pass)."""
    state = seen.value
    if at is not None:
        event = "start" if blocking.condition is Condition.STARTED else "end"
        state += f", predicted to {event} ~{_clock(at, now)}"
    more = f" and {count - 1} more" if count > 1 else ""
    return f"waits for job {blocking.job_id} ({state}){more}"


def _does(condition: Condition) -> str:
    return {
        Condition.SUCCEEDED: "succeeds",
        Condition.ENDED: "ends",
        Condition.FAILED: "fails or is cancelled",
        Condition.STARTED: "starts running",
    }[condition]


def _clock(at: datetime, now: datetime) -> str:
    """Minutes are enough for a prediction; the date only when it is not today's."""
    if at.date() == now.date():
        return at.strftime("%H:%M UTC")
    return at.strftime("%b %d %H:%M UTC")
