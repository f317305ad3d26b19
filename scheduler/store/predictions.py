"""Run-time predictions: each job's latest one, and the finished runs they learn from.

A job's prediction lives in its own table (one row per job, written by the scheduler
loop only when it changed), so the jobs table and its hot paths stay as they were.
`at_start_s` is the total run time predicted while the job last waited: what the
accuracy report compares with the run time it then had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Float, ForeignKey, String, Text, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from gangway.states import JobState
from scheduler.model import CALIBRATION_USER, JobSpec
from scheduler.store.base import Repository
from scheduler.store.specs import spec_from_json
from scheduler.store.tables import Base, JobMetricRow, JobRow, UTCDateTime


class JobPredictionRow(Base):
    __tablename__ = "job_predictions"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    runtime_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    remaining_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    low_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    high_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    source: Mapped[str] = mapped_column(String(20))
    basis: Mapped[str] = mapped_column(Text)
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    estimated_end_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    at_start_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    node_type: Mapped[str | None] = mapped_column(String(100), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


@dataclass(frozen=True, slots=True)
class JobPrediction:
    """What the service expects of one job. `source`: steps (its measured step time),
    model (the step-time model), history (similar finished jobs) or unknown."""

    runtime_s: float | None
    remaining_s: float | None
    low_s: float | None
    high_s: float | None
    source: str
    basis: str
    step_time_s: float | None = None
    estimated_end_at: datetime | None = None
    node_type: str | None = None
    # Priced at assumed speeds (error unknown): shown and estimated with, but the core
    # is not handed it (not stored: the loop makes it anew each start).
    assumed: bool = False


@dataclass(frozen=True, slots=True)
class FinishedRun:
    """A job that succeeded: what was known before it ran, and how long it then ran.
    `step_time_s`: the mean its rank 0 reported (None: not a trainer, or no report)."""

    job_id: int
    finished_at: datetime
    queue: str
    user: str
    name: str
    num_gpus: int
    spec: JobSpec
    dp: int  # as placed: an elastic job's last degree
    runtime_s: float
    step_time_s: float | None
    node_type: str | None


@dataclass(frozen=True, slots=True)
class AccuracyPair:
    predicted_s: float | None
    actual_s: float


class PredictionStore(Repository):
    def predictions(self, job_ids: Iterable[int]) -> dict[int, JobPrediction]:
        ids = list(job_ids)
        if not ids:
            return {}
        query = select(JobPredictionRow).where(JobPredictionRow.job_id.in_(ids))
        with Session(self._engine) as session:
            return {row.job_id: _prediction(row) for row in session.scalars(query)}

    def record_predictions(
        self, changed: Sequence[tuple[int, JobPrediction]], pending: Iterable[int]
    ) -> None:
        """Upsert the changed predictions, in one transaction; for the jobs in `pending`
        the total is also kept as `at_start_s` (what the accuracy report checks)."""
        waiting = set(pending)
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            existing = {
                row.job_id: row
                for row in session.scalars(
                    select(JobPredictionRow).where(
                        JobPredictionRow.job_id.in_([job_id for job_id, _ in changed])
                    )
                )
            }
            for job_id, p in changed:
                row = existing.get(job_id) or JobPredictionRow(job_id=job_id)
                row.runtime_s, row.remaining_s = p.runtime_s, p.remaining_s
                row.low_s, row.high_s, row.source, row.basis = p.low_s, p.high_s, p.source, p.basis
                row.step_time_s, row.estimated_end_at = p.step_time_s, p.estimated_end_at
                row.node_type = p.node_type or row.node_type
                row.updated_at = now
                if job_id in waiting:
                    row.at_start_s = p.runtime_s
                session.add(row)

    def finished_runs(self, since: datetime | None) -> list[FinishedRun]:
        """Succeeded jobs that finished at or after `since` (all when None), oldest
        first. Run time is the last attempt's, start to finish."""
        # Per selected job (job_metrics is indexed by job): only the new finishers' rows.
        step_s = (
            select(func.avg(JobMetricRow.step_time_s))
            .where(JobMetricRow.job_id == JobRow.id)
            .correlate(JobRow)
            .scalar_subquery()
        )
        query = (
            select(JobRow, step_s, JobPredictionRow.node_type)
            .outerjoin(JobPredictionRow, JobPredictionRow.job_id == JobRow.id)
            .where(JobRow.state == JobState.SUCCEEDED.value, JobRow.started_at.is_not(None))
            .order_by(JobRow.finished_at, JobRow.id)
        )
        if since is not None:
            query = query.where(JobRow.finished_at >= since)
        with Session(self._engine) as session:
            return [
                _finished(row, step_s, node_type)
                for row, step_s, node_type in session.execute(query)
            ]

    def accuracy_pairs(self) -> list[AccuracyPair]:
        """(predicted while waiting, actual run time) of every succeeded job that was
        predicted at all (jobs finished before predictions existed are left out), not
        counting calibration runs."""
        query = (
            select(JobRow.started_at, JobRow.finished_at, JobPredictionRow.at_start_s)
            .join(JobPredictionRow, JobPredictionRow.job_id == JobRow.id)
            .where(
                JobRow.state == JobState.SUCCEEDED.value,
                JobRow.started_at.is_not(None),
                JobRow.user != CALIBRATION_USER,  # the service's own runs, not users'
            )
        )
        with Session(self._engine) as session:
            return [
                AccuracyPair(predicted, (finished - started).total_seconds())
                for started, finished, predicted in session.execute(query)
                if started is not None and finished is not None
            ]


def _prediction(row: JobPredictionRow) -> JobPrediction:
    return JobPrediction(
        runtime_s=row.runtime_s,
        remaining_s=row.remaining_s,
        low_s=row.low_s,
        high_s=row.high_s,
        source=row.source,
        basis=row.basis,
        step_time_s=row.step_time_s,
        estimated_end_at=row.estimated_end_at,
        node_type=row.node_type,
    )


def _finished(row: JobRow, step_s: float | None, node_type: str | None) -> FinishedRun:
    assert row.started_at is not None and row.finished_at is not None
    spec = spec_from_json(row.spec)
    return FinishedRun(
        job_id=row.id,
        finished_at=row.finished_at,
        queue=row.queue,
        user=row.user,
        name=row.name,
        num_gpus=row.num_gpus,
        spec=spec,
        dp=spec.placed(tuple(row.placement) if row.placement else None).parallelism.dp,
        runtime_s=max(0.0, (row.finished_at - row.started_at).total_seconds()),
        step_time_s=float(step_s) if step_s is not None else None,
        node_type=node_type,
    )
