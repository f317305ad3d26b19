"""What jobs report: every metric point, by step and attempt, and each job's best value of
its objective.

A point is one progress report of rank 0 (`RankContext.report`, `gangway.report`, the
built-in trainer's every step): a step and any named values. Points live in their own
table, one row per report with its values as JSON, numbered by the rank (`seq`), so a
group reattached after a service restart may send them again and the store keeps each
once. The names a job has reported are kept apart (one row per name), so listing them
never scans the points; the best objective value is kept in a row per job, written only
when it improves. The jobs table and its hot paths are untouched: a report does not
move a job's version, and the scheduler loop reads none of this.

Bounds, since a job's code is anyone's: at most `MAX_NAMES` names per job (values under
further names are dropped) and, per page read, `MAX_PAGE` points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, func, insert, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from scheduler.model import ObjectiveSpec
from scheduler.store.base import Repository
from scheduler.store.records import ReportedPoint, job_row
from scheduler.store.tables import Base, UTCDateTime

MAX_NAMES = 256
MAX_PAGE = 10_000


class JobMetricPointRow(Base):
    __tablename__ = "job_metric_points"
    __table_args__ = (
        Index("ix_job_metric_points_job_id_id", "job_id", "id"),
        Index("ix_job_metric_points_job_id_attempt_seq", "job_id", "attempt", "seq"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)  # the rank's number for the report
    step: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    values: Mapped[dict[str, float]] = mapped_column(JSON)


class JobMetricNameRow(Base):
    __tablename__ = "job_metric_names"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), primary_key=True)


class JobObjectiveRow(Base):
    __tablename__ = "job_objectives"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    metric: Mapped[str] = mapped_column(String(100))
    mode: Mapped[str] = mapped_column(String(3))
    value: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(UTCDateTime)


@dataclass(frozen=True, slots=True)
class StoredPoint:
    id: int  # the store's order of arrival: a reader's cursor
    attempt: int
    step: int
    at: datetime
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class ObjectiveBest:
    metric: str
    mode: str
    value: float
    step: int
    attempt: int
    at: datetime


class ReportedMetricStore(Repository):
    def append_points(
        self,
        job_id: int,
        attempt: int,
        points: Sequence[ReportedPoint],
        objective: ObjectiveSpec | None,
    ) -> int:
        """Store rank 0's new points of one attempt (numbers at or below the newest
        stored one are dropped), record names not seen before, and keep the objective's
        best value if one of them beats it. Returns how many points were stored."""
        if not points:
            return 0
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            newest = session.scalar(
                select(func.max(JobMetricPointRow.seq)).where(
                    JobMetricPointRow.job_id == job_id, JobMetricPointRow.attempt == attempt
                )
            )
            fresh = [p for p in points if newest is None or p.seq > newest]
            if not fresh:
                return 0
            names = _record_names(session, job_id, {n for p in fresh for n in p.values})
            rows = [
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "seq": p.seq,
                    "step": p.step,
                    "at": _utc(p.at),
                    "values": {k: v for k, v in p.values.items() if k in names},
                }
                for p in fresh
            ]
            session.execute(insert(JobMetricPointRow), rows)
            if objective is not None:
                _keep_best(session, job_id, attempt, fresh, objective)
            return len(fresh)

    def reported_points(
        self,
        job_id: int,
        *,
        names: Sequence[str] = (),
        after: int | None = None,
        limit: int = 10_000,
    ) -> tuple[list[StoredPoint], int | None]:
        """The job's points in order of arrival (every attempt), after the point `after`:
        up to `limit` points read, of which those carrying one of `names` are returned
        with only those values (all, without `names`). The cursor to read on from, or
        None once the last point is read."""
        limit = min(limit, MAX_PAGE)
        query = select(JobMetricPointRow).where(JobMetricPointRow.job_id == job_id)
        if after is not None:
            query = query.where(JobMetricPointRow.id > after)
        query = query.order_by(JobMetricPointRow.id).limit(limit + 1)
        with Session(self._engine) as session:
            job_row(session, job_id)  # 404 for an unknown job
            rows = list(session.scalars(query))
        more = len(rows) > limit
        rows = rows[:limit]
        wanted = set(names)
        points = []
        for row in rows:
            values = (
                row.values if not wanted else {k: v for k, v in row.values.items() if k in wanted}
            )
            if values:
                points.append(StoredPoint(row.id, row.attempt, row.step, row.at, dict(values)))
        return points, (rows[-1].id if more and rows else None)

    def values_at(self, job_id: int, step: int) -> dict[str, float]:
        """Everything the job reported at `step` (the latest attempt's word on each name,
        and the latest report's within it)."""
        query = (
            select(JobMetricPointRow.values)
            .where(JobMetricPointRow.job_id == job_id, JobMetricPointRow.step == step)
            .order_by(JobMetricPointRow.attempt, JobMetricPointRow.id)
        )
        merged: dict[str, float] = {}
        with Session(self._engine) as session:
            for values in session.scalars(query):
                merged |= values
        return merged

    def latest_value(self, job_id: int, name: str, at_most_step: int) -> float | None:
        """The job's newest report of `name` at a step up to `at_most_step` (a sweep's
        objective at a rung); None if it reported none there."""
        query = (
            select(JobMetricPointRow.values)
            .where(JobMetricPointRow.job_id == job_id, JobMetricPointRow.step <= at_most_step)
            .order_by(
                JobMetricPointRow.step.desc(),
                JobMetricPointRow.attempt.desc(),
                JobMetricPointRow.id.desc(),
            )
        )
        with Session(self._engine) as session:
            for values in session.scalars(query.execution_options(yield_per=256)):
                if name in values:
                    return float(values[name])
        return None

    def metric_names(self, job_id: int) -> list[str]:
        """Every name the job has reported, sorted."""
        query = (
            select(JobMetricNameRow.name)
            .where(JobMetricNameRow.job_id == job_id)
            .order_by(JobMetricNameRow.name)
        )
        with Session(self._engine) as session:
            return list(session.scalars(query))

    def objectives(self, job_ids: Iterable[int]) -> dict[int, ObjectiveBest]:
        """Each job's best objective value so far (jobs without one are absent)."""
        ids = list(job_ids)
        if not ids:
            return {}
        query = select(JobObjectiveRow).where(JobObjectiveRow.job_id.in_(ids))
        with Session(self._engine) as session:
            return {
                row.job_id: ObjectiveBest(
                    row.metric, row.mode, row.value, row.step, row.attempt, row.at
                )
                for row in session.scalars(query)
            }


def _record_names(session: Session, job_id: int, reported: set[str]) -> set[str]:
    """The reported names the job may keep: those it has, and new ones up to
    `MAX_NAMES` in all (recorded here)."""
    known = set(
        session.scalars(select(JobMetricNameRow.name).where(JobMetricNameRow.job_id == job_id))
    )
    room = max(0, MAX_NAMES - len(known))
    new = sorted(reported - known)[:room]
    if new:
        session.execute(insert(JobMetricNameRow), [{"job_id": job_id, "name": n} for n in new])
    return (known | set(new)) & reported


def _keep_best(
    session: Session,
    job_id: int,
    attempt: int,
    points: Sequence[ReportedPoint],
    objective: ObjectiveSpec,
) -> None:
    """Upsert the job's best value if one of `points` beats it (ties keep the earlier)."""
    best: ReportedPoint | None = None
    for point in points:
        value = point.values.get(objective.metric)
        if value is None or not math.isfinite(value):
            continue
        if best is None or objective.better(value, best.values[objective.metric]):
            best = point
    if best is None:
        return
    value = best.values[objective.metric]
    row = session.get(JobObjectiveRow, job_id)
    if row is not None and (
        row.metric != objective.metric or not objective.better(value, row.value)
    ):
        return
    row = row or JobObjectiveRow(job_id=job_id, metric=objective.metric, mode=objective.mode)
    row.value, row.step, row.attempt, row.at = value, best.step, attempt, _utc(best.at)
    session.add(row)


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
