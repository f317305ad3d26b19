"""Reads of jobs and their events: single jobs, pages for the API, the loop's working set,
counts for /metrics, the usage fair share decays, and which jobs' stored artifacts count
against their owner (outputs quota) or have outlived retention."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.core.fairshare import UsageInterval
from scheduler.model import JobSpec, JobState
from scheduler.store.base import Repository
from scheduler.store.records import EventRecord, JobRecord, event_record, job_record, job_row
from scheduler.store.tables import JobEventRow, JobRow

_CHUNK = 500  # ids per IN (...) list
_TERMINAL = [s.value for s in JobState if s.is_terminal]


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

    def versions(self, states: Iterable[JobState]) -> dict[int, int]:
        """Each job in `states` -> its row version: one narrow query that tells the loop
        which of the jobs it holds changed (see `scheduler.runtime.working_set`)."""
        query = select(JobRow.id, JobRow.version).where(JobRow.state.in_([s.value for s in states]))
        with self._engine.connect() as connection:
            return {job_id: version for job_id, version in connection.execute(query)}

    def many(
        self, job_ids: Iterable[int], specs: Mapping[int, JobSpec] | None = None
    ) -> list[JobRecord]:
        """The jobs with these ids that exist, in id order; in chunks, so a big reload stays
        under every database's limit on bound parameters. `specs`: jobs' specs the caller
        already parsed (a job's spec never changes), used instead of parsing again."""
        known = specs or {}
        ids = sorted(set(job_ids))
        records: list[JobRecord] = []
        with Session(self._engine) as session:
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                query = select(JobRow).where(JobRow.id.in_(chunk)).order_by(JobRow.id)
                records.extend(job_record(r, known.get(r.id)) for r in session.scalars(query))
        return records

    def usage_intervals(self, since: datetime) -> list[UsageInterval]:
        """GPU use of every run that started, and was still going at or after `since`
        (for fair share). A requeued job counts from its latest start."""
        query = select(
            JobRow.queue, JobRow.user, JobRow.num_gpus, JobRow.started_at, JobRow.finished_at
        ).where(
            JobRow.started_at.is_not(None),
            JobRow.finished_at.is_(None) | (JobRow.finished_at >= since),
        )
        with self._engine.connect() as connection:  # columns only: every pass reads them
            return [
                UsageInterval(queue, user, gpus, started, finished)
                for queue, user, gpus, started, finished in connection.execute(query)
                if started is not None
            ]

    def events(self, job_id: int) -> list[EventRecord]:
        with Session(self._engine) as session:
            job_row(session, job_id)  # 404 for an unknown job
            rows = session.scalars(
                select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)
            )
            return [event_record(r) for r in rows]

    def user_job_ends(self, user: str) -> dict[int, datetime | None]:
        """Each of `user`'s jobs -> when it ended (None: not yet): whose outputs count
        against the user's quota, and which of them can still change. Two columns over
        the `user` index."""
        query = select(JobRow.id, JobRow.finished_at).where(JobRow.user == user)
        with self._engine.connect() as connection:
            return {job_id: ended for job_id, ended in connection.execute(query)}

    def ended_between(self, start: datetime | None, end: datetime) -> list[int]:
        """Jobs that ended (a terminal state) at or after `start` (None: ever) and before
        `end`, by id: those whose artifacts a retention sweep deletes next. A job that is
        still active never appears."""
        query = select(JobRow.id).where(
            JobRow.state.in_(_TERMINAL),
            JobRow.finished_at.is_not(None),
            JobRow.finished_at < end,
        )
        if start is not None:
            query = query.where(JobRow.finished_at >= start)
        with self._engine.connect() as connection:
            return list(connection.scalars(query.order_by(JobRow.id)))
