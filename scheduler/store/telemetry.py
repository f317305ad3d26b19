"""Logs and metrics of running jobs: written every poll, read by the API and the page."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import BigInteger, bindparam, func, insert, select, update
from sqlalchemy.orm import Session, aliased

from scheduler.store.base import Repository
from scheduler.store.records import LogLine, MetricPoint, ProgressNote, ProgressPoint, job_row
from scheduler.store.retention import newest_log_seqs
from scheduler.store.tables import (
    JobLogRow,
    JobMetricRow,
    JobRow,
    fresh_versions,
    written_version,
)


class TelemetryStore(Repository):
    def record_progress(self, job_id: int, attempt: int, point: ProgressPoint) -> None:
        """`record_progress_many` for one job."""
        self.record_progress_many([ProgressNote(job_id, attempt, point)])

    def record_progress_many(
        self, notes: Sequence[ProgressNote]
    ) -> tuple[dict[int, int], datetime]:
        """Store the latest training progress on each job and as a point of its metric
        series, all in one transaction (a pass that polls thousands of gangs pays one
        commit and one fence check). `first_loss` is the loss of the attempt's first step
        (ranks keep it, since the loop may first look several steps in); the job keeps
        the first one it ever saw, to show the trend across restarts.

        Returns the time written as `progress_at` and the versions rows got, as
        `JobStore.explain_waits` does."""
        now = self._clock()
        if not notes:
            return {}, now
        fresh = fresh_versions(n.job_id for n in notes if n.seen_version is not None)
        statement = (
            update(JobRow)
            .where(JobRow.id == bindparam("p_id"))
            .values(
                step=bindparam("p_step"),
                loss=bindparam("p_loss"),
                tokens_per_s=bindparam("p_tokens"),
                checkpoint_step=bindparam("p_checkpoint"),
                step_time_s=bindparam("p_step_time"),
                first_loss=func.coalesce(JobRow.first_loss, bindparam("p_first_loss")),
                progress_at=now,
                version=written_version(
                    bindparam("p_seen", type_=BigInteger()),
                    bindparam("p_version", type_=BigInteger()),
                ),
            )
        )
        rows = [
            {
                "p_id": n.job_id,
                "p_step": n.point.step,
                "p_loss": n.point.loss,
                "p_tokens": n.point.tokens_per_s,
                "p_checkpoint": n.point.checkpoint_step,
                "p_step_time": n.point.step_time_s,
                "p_first_loss": n.point.first_loss,
                "p_seen": n.seen_version if n.seen_version is not None else -1,
                "p_version": fresh.get(n.job_id, -1),
            }
            for n in notes
        ]
        metrics = [
            {
                "job_id": n.job_id,
                "attempt": n.attempt,
                "step": n.point.step,
                "at": now,
                "loss": n.point.loss,
                "tokens_per_s": n.point.tokens_per_s,
                "step_time_s": n.point.step_time_s,
                "memory_mb": n.point.memory_mb,
                "comm_s": n.point.comm_s,
                "comm_bytes": n.point.comm_bytes,
            }
            for n in notes
        ]
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            connection = session.connection()
            connection.execute(statement, rows)
            connection.execute(insert(JobMetricRow), metrics)
        return fresh, now

    def metrics(self, job_id: int, *, max_points: int = 500) -> list[MetricPoint]:
        """The job's metric series, oldest first, thinned to at most `max_points` evenly
        spaced points (the newest always kept). The database does the thinning: a long
        job has a point per poll, and a chart needs only a few hundred."""
        of_job = JobMetricRow.job_id == job_id
        with Session(self._engine) as session:
            job_row(session, job_id)  # 404 for an unknown job
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

    def append_logs(self, job_id: int, attempt: int, lines: Sequence[tuple[int, int, str]]) -> int:
        """Store (rank, seq, line) output of one attempt; lines at or below a rank's
        newest stored seq are dropped (a reattached group sends them again). Returns
        how many were stored."""
        if not lines:
            return 0
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            newest = newest_log_seqs(session, job_id, attempt, {rank for rank, _, _ in lines})
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
            job_row(session, job_id)  # 404 for an unknown job
            rows = list(session.scalars(query))
        if after is None:
            rows.reverse()
        return [LogLine(r.attempt, r.rank, r.seq, r.line, r.id) for r in rows]
