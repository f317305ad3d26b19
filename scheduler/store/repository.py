"""The job repository: every read and write of jobs, events and nodes goes through here.

State changes go through `transition` only: it checks the old state in the UPDATE's WHERE
clause (a compare-and-set, safe against a concurrent writer) and writes the event row in
the same transaction, so the event log can never disagree with the job's state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from scheduler.core.fairshare import UsageInterval
from scheduler.model import JobState, Node, is_legal_transition
from scheduler.store.tables import (
    JobEventRow,
    JobLogRow,
    JobMetricRow,
    JobRow,
    LeaseRow,
    NodeRow,
)


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

    def __init__(self, job_id: int, expected: JobState, actual: JobState) -> None:
        super().__init__(f"job {job_id}: expected state {expected}, found {actual}")
        self.job_id, self.expected, self.actual = job_id, expected, actual


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


@dataclass(frozen=True)
class JobRecord:
    id: int
    name: str
    queue: str
    user: str
    priority: int
    state: JobState
    spec: dict[str, Any]
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


@dataclass(frozen=True)
class ProgressPoint:
    """What one poll saw of a running job (rank 0's latest report)."""

    step: int
    loss: float | None = None
    first_loss: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    memory_mb: float | None = None
    comm_s: float | None = None
    comm_bytes: float | None = None


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


def utcnow() -> datetime:
    return datetime.now(UTC)


_TIMESTAMP_ON_ENTRY = {
    JobState.ADMITTED: "admitted_at",
    JobState.RUNNING: "started_at",
    JobState.SUCCEEDED: "finished_at",
    JobState.FAILED: "finished_at",
    JobState.CANCELLED: "finished_at",
}


def _scheduling_history(row: JobRow, old: JobState, new: JobState, now: datetime) -> dict[str, Any]:
    """What a transition adds to the history the policy ranks by: entering PENDING starts
    a queue period, leaving it banks the wait; a run that ends (RUNNING or PREEMPTING to
    anything but PREEMPTING) banks its GPU-seconds as attained service."""
    values: dict[str, Any] = {}
    if new is JobState.PENDING:
        values["queued_at"] = now
    elif old is JobState.PENDING and row.queued_at is not None:
        values["waited_s"] = row.waited_s + max(0.0, (now - row.queued_at).total_seconds())
    ran = old in (JobState.RUNNING, JobState.PREEMPTING) and new is not JobState.PREEMPTING
    if ran and row.started_at is not None:
        run_s = max(0.0, (now - row.started_at).total_seconds())
        values["attained_gpu_s"] = row.attained_gpu_s + run_s * row.num_gpus
    return values


class JobRepository:
    """`clock` stamps every row; the simulator and tests pass their own."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    @property
    def engine(self) -> Engine:
        """For the other repositories over the same database (accounts, queues)."""
        return self._engine

    def now(self) -> datetime:
        """The time this repository stamps rows with (tests pass their own clock)."""
        return self._clock()

    def with_clock(self, clock: Callable[[], datetime]) -> JobRepository:
        return JobRepository(self._engine, clock=clock)

    # -- jobs -------------------------------------------------------------------------

    def create(self, new: NewJob, *, reason: str = "submitted") -> JobRecord:
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            row = JobRow(
                name=new.name,
                queue=new.queue,
                user=new.user,
                priority=new.priority,
                state=JobState.PENDING.value,
                spec=new.spec,
                num_gpus=new.num_gpus,
                total_steps=new.total_steps,
                submitted_at=now,
                updated_at=now,
                queued_at=now,
                waited_s=0.0,
                attained_gpu_s=0.0,
                status_reason="waiting for the scheduler",
                attempt=0,
                restarts=0,
                step=0,
                idempotency_key=new.idempotency_key,
                request_digest=new.request_digest,
            )
            session.add(row)
            session.flush()
            session.add(
                JobEventRow(
                    job_id=row.id, at=now, from_state=None, to_state=row.state, reason=reason
                )
            )
            session.flush()
            return _job_record(row)

    def create_once(self, new: NewJob) -> tuple[JobRecord, bool]:
        """`create`, unless a job was already submitted with `new.idempotency_key`: then
        that job, and False. A key sent again with another body raises `KeyReused`.
        Two requests racing with one key make one job: the unique index lets one insert
        win, and the other finds it."""
        key = new.idempotency_key
        if key is None:
            return self.create(new), True
        found = self._by_idempotency_key(key)
        if found is None:
            try:
                return self.create(new), True
            except IntegrityError:
                found = self._by_idempotency_key(key)
                if found is None:
                    raise
        record, digest = found
        if digest != new.request_digest:
            raise KeyReused(key, record.id)
        return record, False

    def _by_idempotency_key(self, key: str) -> tuple[JobRecord, str | None] | None:
        with Session(self._engine) as session:
            row = session.scalars(select(JobRow).where(JobRow.idempotency_key == key)).first()
            return (_job_record(row), row.request_digest) if row is not None else None

    def get(self, job_id: int) -> JobRecord:
        with Session(self._engine) as session:
            row = _job_row(session, job_id)
            return _job_record(row)

    def page(
        self,
        *,
        states: Sequence[JobState] = (),
        queue: str | None = None,
        user: str | None = None,
        name_prefix: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[JobRecord]:
        """Newest first, filtered; `before_id` is the cursor returned with the previous
        page (ids only grow, so a page never repeats or skips a job)."""
        query = select(JobRow).order_by(JobRow.id.desc()).limit(limit)
        if states:
            query = query.where(JobRow.state.in_([s.value for s in states]))
        if queue is not None:
            query = query.where(JobRow.queue == queue)
        if user is not None:
            query = query.where(JobRow.user == user)
        if name_prefix:
            query = query.where(JobRow.name.startswith(name_prefix, autoescape=True))
        if before_id is not None:
            query = query.where(JobRow.id < before_id)
        with Session(self._engine) as session:
            return [_job_record(r) for r in session.scalars(query)]

    def count_jobs(self) -> dict[tuple[JobState, str], int]:
        """How many jobs there are per (state, queue)."""
        query = select(JobRow.state, JobRow.queue, func.count()).group_by(
            JobRow.state, JobRow.queue
        )
        with Session(self._engine) as session:
            return {
                (JobState(state), queue): int(count)
                for state, queue, count in session.execute(query)
            }

    def in_states(self, states: Iterable[JobState]) -> list[JobRecord]:
        query = (
            select(JobRow).where(JobRow.state.in_([s.value for s in states])).order_by(JobRow.id)
        )
        with Session(self._engine) as session:
            return [_job_record(r) for r in session.scalars(query)]

    def transition(
        self,
        job_id: int,
        new_state: JobState,
        *,
        reason: str,
        expected: JobState | None = None,
        **fields: Any,
    ) -> JobRecord:
        """Move a job to `new_state`, writing an event row; the only way state changes.

        `expected` pins the old state (raise `StaleState` if it is something else).
        `fields` are other columns to set in the same UPDATE (placement, error, ...).
        """
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            row = _job_row(session, job_id)
            old = JobState(row.state)
            if expected is not None and old is not expected:
                raise StaleState(job_id, expected, old)
            if not is_legal_transition(old, new_state):
                raise IllegalTransition(job_id, old, new_state)
            values: dict[str, Any] = {"state": new_state.value, "updated_at": now, **fields}
            values.setdefault("status_reason", reason)
            if new_state is not JobState.PENDING:
                values.setdefault("estimated_start_at", None)
                values.setdefault("explanation", None)
            stamp = _TIMESTAMP_ON_ENTRY.get(new_state)
            if stamp is not None:
                values.setdefault(stamp, now)
            values.update(_scheduling_history(row, old, new_state, now))
            result = session.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.state == old.value)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                raise StaleState(job_id, old, JobState(self._current_state(session, job_id)))
            session.add(
                JobEventRow(
                    job_id=job_id,
                    at=now,
                    from_state=old.value,
                    to_state=new_state.value,
                    reason=reason,
                )
            )
            session.flush()
            session.expire_all()
            fresh = session.get(JobRow, job_id)
            assert fresh is not None
            return _job_record(fresh)

    def explain_wait(
        self,
        job_id: int,
        reason: str,
        *,
        explanation: dict[str, Any] | None = None,
        estimated_start_at: datetime | None = None,
    ) -> None:
        """Record why a pending job waits and when it should start (no event: it is not a
        state change). A job no longer pending keeps what it has. The caller skips calls
        that would change nothing."""
        with Session(self._engine) as session, session.begin():
            session.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.state == JobState.PENDING.value)
                .values(
                    status_reason=reason,
                    explanation=explanation,
                    estimated_start_at=estimated_start_at,
                    updated_at=self._clock(),
                )
            )

    def record_progress(self, job_id: int, attempt: int, point: ProgressPoint) -> None:
        """Store the latest training progress on the job and as a point of its metric
        series, in one transaction. `first_loss` is the loss of the attempt's first step
        (ranks keep it, since the loop may first look several steps in); the job keeps
        the first one it ever saw, to show the trend across restarts."""
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            row = _job_row(session, job_id)
            if row.first_loss is None:
                row.first_loss = point.first_loss
            row.step, row.loss, row.tokens_per_s = point.step, point.loss, point.tokens_per_s
            row.progress_at = now
            session.add(
                JobMetricRow(
                    job_id=job_id,
                    attempt=attempt,
                    step=point.step,
                    at=now,
                    loss=point.loss,
                    tokens_per_s=point.tokens_per_s,
                    step_time_s=point.step_time_s,
                    memory_mb=point.memory_mb,
                    comm_s=point.comm_s,
                    comm_bytes=point.comm_bytes,
                )
            )

    def metrics(self, job_id: int, *, max_points: int = 500) -> list[MetricPoint]:
        """The job's metric series, oldest first, thinned to at most `max_points` evenly
        spaced points (the newest always kept). The database does the thinning: a long
        job has a point per poll, and a chart needs only a few hundred."""
        of_job = JobMetricRow.job_id == job_id
        with Session(self._engine) as session:
            _job_row(session, job_id)  # 404 for an unknown job
            total = session.scalar(select(func.count()).where(of_job)) or 0
            stride = max(1, math.ceil(total / max_points))
            numbered = (
                select(JobMetricRow, func.row_number().over(order_by=JobMetricRow.id).label("n"))
                .where(of_job)
                .subquery()
            )
            point = aliased(JobMetricRow, numbered)
            kept = list(
                session.scalars(
                    select(point)
                    .where(((numbered.c.n - 1) % stride == 0) | (numbered.c.n == total))
                    .order_by(numbered.c.id)
                )
            )
        if (total - 1) % stride:  # the newest came in beside the last evenly spaced one
            del kept[-2]
        return [
            MetricPoint(
                r.attempt,
                r.step,
                r.at,
                r.loss,
                r.tokens_per_s,
                r.step_time_s,
                r.memory_mb,
                r.comm_s,
                r.comm_bytes,
            )
            for r in kept
        ]

    def recent_losses(self, job_ids: Sequence[int], *, points: int = 30) -> dict[int, list[float]]:
        """The last `points` losses of each job, oldest first: one query for a page of
        jobs (the status page draws a trend per row)."""
        if not job_ids:
            return {}
        newest_first = func.row_number().over(
            partition_by=JobMetricRow.job_id, order_by=JobMetricRow.id.desc()
        )
        numbered = (
            select(JobMetricRow.job_id, JobMetricRow.id, JobMetricRow.loss, newest_first.label("n"))
            .where(JobMetricRow.job_id.in_(job_ids), JobMetricRow.loss.is_not(None))
            .subquery()
        )
        query = (
            select(numbered.c.job_id, numbered.c.loss)
            .where(numbered.c.n <= points)
            .order_by(numbered.c.job_id, numbered.c.id)
        )
        trends: dict[int, list[float]] = {}
        with Session(self._engine) as session:
            for job_id, loss in session.execute(query):
                trends.setdefault(job_id, []).append(loss)
        return trends

    def annotate(self, job_id: int, reason: str, **fields: Any) -> JobRecord:
        """Set `fields` and say so in an event that keeps the state (from = to): not a
        state change (a priority change, a straggler flagged), but something the job's
        owner should find in its timeline. A job that already ended is not changed: 409."""
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            row = _job_row(session, job_id)
            state = JobState(row.state)
            if state.is_terminal:
                raise JobEnded(job_id, state)
            for name, value in fields.items():
                setattr(row, name, value)
            row.updated_at = now
            session.add(
                JobEventRow(job_id=job_id, at=now, from_state=state, to_state=state, reason=reason)
            )
            session.flush()
            return _job_record(row)

    def append_logs(self, job_id: int, attempt: int, lines: Sequence[tuple[int, int, str]]) -> int:
        """Store (rank, seq, line) output of one attempt; lines at or below a rank's
        newest stored seq are dropped (a reattached group sends them again). Returns
        how many were stored."""
        if not lines:
            return 0
        with Session(self._engine) as session, session.begin():
            newest = dict(
                session.execute(
                    select(JobLogRow.rank, func.max(JobLogRow.seq))
                    .where(JobLogRow.job_id == job_id, JobLogRow.attempt == attempt)
                    .group_by(JobLogRow.rank)
                ).all()
            )
            fresh = [
                JobLogRow(job_id=job_id, attempt=attempt, rank=rank, seq=seq, line=line)
                for rank, seq, line in lines
                if seq > newest.get(rank, 0)
            ]
            session.add_all(fresh)
            return len(fresh)

    def logs(
        self,
        job_id: int,
        *,
        rank: int | None = None,
        tail: int = 200,
        after: int | None = None,
    ) -> list[LogLine]:
        """Lines of the job (all attempts), oldest first: the last `tail`, or with `after`
        (a line's `id`) the first `tail` after it, for a reader that follows."""
        query = select(JobLogRow).where(JobLogRow.job_id == job_id)
        if rank is not None:
            query = query.where(JobLogRow.rank == rank)
        if after is None:
            query = query.order_by(JobLogRow.id.desc()).limit(tail)
        else:
            query = query.where(JobLogRow.id > after).order_by(JobLogRow.id).limit(tail)
        with Session(self._engine) as session:
            _job_row(session, job_id)  # 404 for an unknown job
            rows = list(session.scalars(query))
        if after is None:
            rows.reverse()
        return [LogLine(r.attempt, r.rank, r.seq, r.line, r.id) for r in rows]

    def usage_intervals(self, since: datetime) -> list[UsageInterval]:
        """GPU use of every run that started, and was still going at or after `since`
        (for fair share). A requeued job counts from its latest start."""
        query = select(JobRow).where(
            JobRow.started_at.is_not(None),
            JobRow.finished_at.is_(None) | (JobRow.finished_at >= since),
        )
        with Session(self._engine) as session:
            return [
                UsageInterval(r.queue, r.user, r.num_gpus, r.started_at, r.finished_at)
                for r in session.scalars(query)
                if r.started_at is not None
            ]

    def events(self, job_id: int) -> list[EventRecord]:
        with Session(self._engine) as session:
            _job_row(session, job_id)  # 404 for an unknown job
            rows = session.scalars(
                select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)
            )
            return [_event_record(r) for r in rows]

    # -- nodes ------------------------------------------------------------------------

    def replace_nodes(self, nodes: Sequence[Node]) -> None:
        """Store the cluster snapshot the scheduler just took (the API reads it)."""
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            session.execute(delete(NodeRow))
            session.add_all(
                NodeRow(
                    id=n.id,
                    name=n.name,
                    num_gpus=n.num_gpus,
                    num_cpus=n.num_cpus,
                    alive=n.alive,
                    updated_at=now,
                )
                for n in nodes
            )

    def nodes(self) -> list[Node]:
        with Session(self._engine) as session:
            rows = session.scalars(select(NodeRow).order_by(NodeRow.name, NodeRow.id))
            return [Node(r.id, r.name, r.num_gpus, r.num_cpus, r.alive) for r in rows]

    # -- leases ---------------------------------------------------------------------------

    def hold_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew lease `name` for `holder` until now + `ttl_s`; False while another
        holder's is unexpired. One conditional UPDATE (or the very first INSERT), so two
        services racing for it cannot both win, on SQLite or PostgreSQL."""
        now = self._clock()
        until = now + timedelta(seconds=ttl_s)
        with Session(self._engine) as session, session.begin():
            result = session.execute(
                update(LeaseRow)
                .where(
                    LeaseRow.name == name,
                    (LeaseRow.holder == holder) | (LeaseRow.expires_at < now),
                )
                .values(holder=holder, expires_at=until)
            )
            if result.rowcount == 1:  # type: ignore[attr-defined]
                return True
            if session.get(LeaseRow, name) is not None:
                return False
        try:
            with Session(self._engine) as session, session.begin():
                session.add(LeaseRow(name=name, holder=holder, expires_at=until))
        except IntegrityError:  # another holder inserted it first
            return False
        return True

    def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up now (if `holder` has it), so a standby need not wait it out."""
        with Session(self._engine) as session, session.begin():
            session.execute(
                delete(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder)
            )

    @staticmethod
    def _current_state(session: Session, job_id: int) -> str:
        state = session.scalar(select(JobRow.state).where(JobRow.id == job_id))
        return state or "?"


def _job_row(session: Session, job_id: int) -> JobRow:
    row = session.get(JobRow, job_id)
    if row is None:
        raise JobNotFound(job_id)
    return row


def _job_record(row: JobRow) -> JobRecord:
    return JobRecord(
        id=row.id,
        name=row.name,
        queue=row.queue,
        user=row.user,
        priority=row.priority,
        state=JobState(row.state),
        spec=row.spec,
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
        estimated_start_at=row.estimated_start_at,
        explanation=row.explanation,
        preempt_deadline=row.preempt_deadline,
        queued_at=row.queued_at,
        waited_s=row.waited_s,
        attained_gpu_s=row.attained_gpu_s,
        stragglers=tuple(row.stragglers or ()),
    )


def _event_record(row: JobEventRow) -> EventRecord:
    return EventRecord(
        id=row.id,
        job_id=row.job_id,
        at=row.at,
        from_state=JobState(row.from_state) if row.from_state else None,
        to_state=JobState(row.to_state),
        reason=row.reason,
    )
