"""How much telemetry (log lines, metric points) the store keeps, and the sweep that
deletes the rest.

Logs and metrics grow with every poll of every running job; without a bound a chatty job
fills the database. Settings bound them: lines kept per job (the newest), an age (the
service's metric samples older than it; all lines of jobs that ended longer ago), and the
points a job reported kept per job (the newest; never by age: they are its results).
Jobs and their events are never deleted here: they are the record of what ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, func, or_, select
from sqlalchemy.orm import Session

from scheduler.store.reported import JobMetricPointRow
from scheduler.store.tables import JobLogRow, JobMetricRow, JobRow


@dataclass(frozen=True)
class Retention:
    log_lines_per_job: int = 100_000
    telemetry_age: timedelta = timedelta(days=30)
    # What a job reports is its result: kept as long as the job, but no more than this
    # many points (the newest), so no job's code can fill the database.
    reported_points_per_job: int = 1_000_000

    def __post_init__(self) -> None:
        if self.log_lines_per_job < 1:
            raise ValueError("log_lines_per_job must be >= 1")
        if self.reported_points_per_job < 1:
            raise ValueError("reported_points_per_job must be >= 1")
        if self.telemetry_age <= timedelta(0):
            raise ValueError("telemetry_age must be positive")


@dataclass(frozen=True)
class Pruned:
    log_lines: int
    metric_points: int
    reported_points: int = 0


def newest_log_seqs(
    session: Session, job_id: int, attempt: int, ranks: Iterable[int]
) -> dict[int, int]:
    """Each rank's newest stored `seq` in this attempt, in one round trip: a max per rank
    over the (job_id, attempt, rank, seq) index is one probe, not a scan of the job's
    lines (which the per-poll append used to do)."""
    ordered = sorted(set(ranks))
    if not ordered:
        return {}
    probes = [
        select(func.max(JobLogRow.seq))
        .where(JobLogRow.job_id == job_id, JobLogRow.attempt == attempt, JobLogRow.rank == rank)
        .scalar_subquery()
        for rank in ordered
    ]
    row = session.execute(select(*probes)).one()
    return {rank: seq for rank, seq in zip(ordered, row, strict=True) if seq is not None}


class TelemetrySweeper:
    """Deletes what `Retention` does not keep. Each sweep looks only at jobs that could
    have changed since the previous one (not ended, or ended since), so its cost follows
    the active jobs, not the history."""

    def __init__(self, engine: Engine, retention: Retention, clock: Callable[[], datetime]):
        self._engine, self._retention, self._clock = engine, retention, clock
        self._last_sweep: datetime | None = None
        self._last_cutoff: datetime | None = None

    def sweep(self) -> Pruned:
        now = self._clock()
        cutoff = now - self._retention.telemetry_age
        with Session(self._engine) as session, session.begin():
            lines = self._cap(session, JobLogRow, self._retention.log_lines_per_job)
            lines += self._expire_lines(session, cutoff)
            points = session.execute(delete(JobMetricRow).where(JobMetricRow.at < cutoff))
            reported = self._cap(
                session, JobMetricPointRow, self._retention.reported_points_per_job
            )
        self._last_sweep, self._last_cutoff = now, cutoff
        return Pruned(log_lines=lines, metric_points=_count(points), reported_points=reported)

    def _cap(self, session: Session, table: type[JobLogRow | JobMetricPointRow], keep: int) -> int:
        """Delete all but each job's newest `keep` rows of `table`."""
        over_cap = select(table.job_id).group_by(table.job_id).having(func.count() > keep)
        if self._last_sweep is not None:  # the first sweep looks at every job
            changed = or_(JobRow.finished_at.is_(None), JobRow.finished_at >= self._last_sweep)
            over_cap = over_cap.where(table.job_id.in_(select(JobRow.id).where(changed)))
        over = session.scalars(over_cap).all()
        deleted = 0
        for job_id in over:
            oldest_kept = (
                select(table.id)
                .where(table.job_id == job_id)
                .order_by(table.id.desc())
                .offset(keep - 1)
                .limit(1)
                .scalar_subquery()
            )
            result = session.execute(
                delete(table).where(table.job_id == job_id, table.id < oldest_kept)
            )
            deleted += _count(result)
        return deleted

    def _expire_lines(self, session: Session, cutoff: datetime) -> int:
        ended = JobRow.finished_at < cutoff
        if self._last_cutoff is not None:
            ended = ended & (JobRow.finished_at >= self._last_cutoff)
        result = session.execute(
            delete(JobLogRow).where(JobLogRow.job_id.in_(select(JobRow.id).where(ended)))
        )
        return _count(result)


def _count(result: object) -> int:
    rowcount: int = getattr(result, "rowcount", 0)
    return max(rowcount, 0)
