"""Reads of jobs and their events: single jobs, pages for the API, the loop's working set,
counts for /metrics and the usage fair share decays."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.core.fairshare import UsageInterval
from scheduler.model import JobState
from scheduler.store.base import Repository
from scheduler.store.records import EventRecord, JobRecord, event_record, job_record, job_row
from scheduler.store.tables import JobEventRow, JobRow


class JobReads(Repository):
    def get(self, job_id: int) -> JobRecord:
        with Session(self._engine) as session:
            row = job_row(session, job_id)
            return job_record(row)

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
            return [job_record(r) for r in session.scalars(query)]

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
            return [job_record(r) for r in session.scalars(query)]

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
            job_row(session, job_id)  # 404 for an unknown job
            rows = session.scalars(
                select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)
            )
            return [event_record(r) for r in rows]
