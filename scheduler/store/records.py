"""What the store hands out: plain records (no ORM objects leave a session) and the errors
its writes raise."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.model import Condition, JobSpec, JobState
from scheduler.store.specs import spec_from_json
from scheduler.store.tables import JobEventRow, JobRow


class JobNotFound(LookupError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class IllegalTransition(ValueError):
    """The state machine has no such edge (a bug, or a request that makes no sense now)."""

    def __init__(self, job_id: int, old: JobState, new: JobState) -> None:
        super().__init__(f"job {job_id}: cannot go from {old} to {new}")
        self.job_id, self.old, self.new = job_id, old, new


class JobEnded(ValueError):
    """The job reached a terminal state; it can no longer be changed."""

    def __init__(self, job_id: int, state: JobState) -> None:
        super().__init__(f"job {job_id} already ended ({state}); it can no longer be changed")
        self.job_id, self.state = job_id, state


class KeyReused(ValueError):
    """An Idempotency-Key came back with a different job body."""

    def __init__(self, key: str, job_id: int) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was used for job {job_id} with a different body; "
            "use a new key for a new job"
        )
        self.key, self.job_id = key, job_id


class StaleState(RuntimeError):
    """The job's state changed under us (another writer won); re-read and decide again."""

    def __init__(self, job_id: int, expected: JobState, actual: JobState, detail: str = "") -> None:
        super().__init__(f"job {job_id}: expected state {expected}, found {actual}{detail}")
        self.job_id, self.expected, self.actual = job_id, expected, actual


@dataclass(frozen=True, slots=True)
class Step:
    """An earlier job of the same pipeline, by its place in the batch (it has no id yet)."""

    index: int


@dataclass(frozen=True)
class NewJob:
    name: str
    queue: str
    priority: int
    spec: dict[str, Any]
    num_gpus: int
    total_steps: int | None
    user: str = "default"
    idempotency_key: str | None = None
    request_digest: str | None = None  # of the submitted body, to tell a retry from a reuse
    # (upstream job, condition): jobs it waits for, written with it in one transaction;
    # within a pipeline an upstream job may be an earlier step of the batch
    depends_on: tuple[tuple[int | Step, Condition], ...] = ()


@dataclass(frozen=True)
class JobRecord:
    id: int
    name: str
    queue: str
    user: str
    priority: int
    state: JobState
    spec: JobSpec
    num_gpus: int
    submitted_at: datetime
    updated_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    status_reason: str
    error: str | None
    attempt: int
    restarts: int
    placement: tuple[str, ...] | None
    step: int
    total_steps: int | None
    loss: float | None
    first_loss: float | None
    tokens_per_s: float | None
    progress_at: datetime | None
    estimated_start_at: datetime | None
    explanation: dict[str, Any] | None
    preempt_deadline: datetime | None
    queued_at: datetime | None = None
    waited_s: float = 0.0
    attained_gpu_s: float = 0.0
    stragglers: tuple[dict[str, Any], ...] = ()
    version: int = 0  # moves with every write to the job's row
    pipeline_id: int | None = None
    hold: str | None = None  # why it may not start until released (a paused sweep trial)
    # The running attempt's newest saved step and rank 0's latest measured step time
    # (None: not reported): what a preemption now would lose.
    checkpoint_step: int | None = None
    step_time_s: float | None = None
    # The body as submitted (JobSubmit's JSON): what the API shows back.
    spec_json: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class WaitNote:
    """Why a pending job waits, as the loop writes it after a pass."""

    job_id: int
    reason: str
    explanation: dict[str, Any] | None = None
    estimated_start_at: datetime | None = None
    seen_version: int | None = None  # write only while the row is still at this version


@dataclass(frozen=True)
class ProgressPoint:
    """What one poll saw of a running job (rank 0's latest report)."""

    step: int
    loss: float | None = None
    first_loss: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    memory_mb: float | None = None
    checkpoint_step: int | None = None  # the newest step the attempt has saved
    comm_s: float | None = None
    comm_bytes: float | None = None


@dataclass(frozen=True)
class ProgressNote:
    """A progress point of one job's attempt, as the loop writes it after a poll."""

    job_id: int
    attempt: int
    point: ProgressPoint
    seen_version: int | None = None  # the row's version when the loop read it


@dataclass(frozen=True)
class MetricPoint:
    attempt: int
    step: int
    at: datetime
    loss: float | None
    tokens_per_s: float | None
    step_time_s: float | None
    memory_mb: float | None
    comm_s: float | None = None
    comm_bytes: float | None = None


@dataclass(frozen=True)
class ReportedPoint:
    """One progress report of rank 0: its number in the rank's series (the store drops
    numbers it has, so a reattached group may send them again), step, time, values."""

    seq: int
    step: int
    at: float  # seconds since the epoch, the rank's clock
    values: dict[str, float]

    @classmethod
    def from_wire(cls, seq: int, point: dict[str, Any]) -> ReportedPoint:
        values = {str(k): float(v) for k, v in dict(point.get("values", {})).items()}
        return cls(seq, int(point["step"]), float(point["at"]), values)


@dataclass(frozen=True)
class LogLine:
    attempt: int
    rank: int
    seq: int
    line: str
    id: int = 0  # the store's order of arrival: a follower's cursor


@dataclass(frozen=True)
class EventRecord:
    id: int
    job_id: int
    at: datetime
    from_state: JobState | None
    to_state: JobState
    reason: str


def job_record(row: JobRow, spec: JobSpec | None = None) -> JobRecord:
    """The row as a record; `spec`, when given, is the row's spec already parsed."""
    return JobRecord(
        id=row.id,
        name=row.name,
        queue=row.queue,
        user=row.user,
        priority=row.priority,
        state=JobState(row.state),
        spec=spec if spec is not None else spec_from_json(row.spec),
        spec_json=row.spec,
        num_gpus=row.num_gpus,
        submitted_at=row.submitted_at,
        updated_at=row.updated_at,
        admitted_at=row.admitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        status_reason=row.status_reason,
        error=row.error,
        attempt=row.attempt,
        restarts=row.restarts,
        placement=tuple(row.placement) if row.placement is not None else None,
        step=row.step,
        total_steps=row.total_steps,
        loss=row.loss,
        first_loss=row.first_loss,
        tokens_per_s=row.tokens_per_s,
        progress_at=row.progress_at,
        checkpoint_step=row.checkpoint_step,
        step_time_s=row.step_time_s,
        estimated_start_at=row.estimated_start_at,
        explanation=row.explanation,
        preempt_deadline=row.preempt_deadline,
        queued_at=row.queued_at,
        waited_s=row.waited_s,
        attained_gpu_s=row.attained_gpu_s,
        stragglers=tuple(row.stragglers or ()),
        version=row.version,
        pipeline_id=row.pipeline_id,
        hold=row.hold,
    )


def event_record(row: JobEventRow) -> EventRecord:
    return EventRecord(
        id=row.id,
        job_id=row.job_id,
        at=row.at,
        from_state=JobState(row.from_state) if row.from_state else None,
        to_state=JobState(row.to_state),
        reason=row.reason,
    )


def job_row(session: Session, job_id: int) -> JobRow:
    """The job's row in this session; JobNotFound (a 404) when there is none."""
    row = session.get(JobRow, job_id)
    if row is None:
        raise JobNotFound(job_id)
    return row


def new_job(
    body: dict[str, Any], *, depends_on: tuple[tuple[int | Step, Condition], ...] = ()
) -> NewJob:
    """A checked job body as the row to store, for the jobs the service makes itself (a
    sweep's trials, calibration runs): its shape read from the body as any stored job's."""
    entry = body["entrypoint"]
    return NewJob(
        name=body["name"],
        queue=body["queue"],
        user=body["user"],
        priority=body["priority"],
        spec=body,
        num_gpus=spec_from_json(body).shape.num_gpus,
        total_steps=entry.get("steps") if entry["kind"] == "builtin" else None,
        depends_on=depends_on,
    )
