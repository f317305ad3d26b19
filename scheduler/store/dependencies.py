"""Dependencies between jobs: which are open for the loop to judge, what it settled, and
each job's upstream and downstream jobs for readers.

Rows are written with their job (`JobStore.create`, one transaction). The loop reads the
waiting ones with their jobs' states in one query per pass (a partial index holds only
waiting rows: none, the common case, costs one index probe) and closes those it settled;
it cancels jobs through `transition` first, so a crash between the two leaves a row the
next pass closes, never a job that runs without its condition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, aliased

from scheduler.core.dependencies import OpenDependency, Upstream
from scheduler.model import Condition, JobState
from scheduler.store.base import Repository
from scheduler.store.tables import JobDependencyRow, JobRow


@dataclass(frozen=True, slots=True)
class Link:
    """One end of a dependency as a reader sees it: the other job, its name and state,
    the condition, and whether it is still waited for or was met (when)."""

    job_id: int
    name: str
    state: JobState
    condition: Condition
    waiting: bool
    met_at: datetime | None


@dataclass(frozen=True, slots=True)
class Links:
    upstream: list[Link]  # the jobs this one waits (or waited) for
    downstream: list[Link]  # the jobs that wait (or waited) for this one


class DependencyStore(Repository):
    def open_dependencies(self) -> list[OpenDependency]:
        """Every waiting dependency, with the states of both jobs."""
        job, upstream = aliased(JobRow), aliased(JobRow)
        query = (
            select(
                JobDependencyRow.job_id,
                job.state,
                JobDependencyRow.upstream_id,
                JobDependencyRow.condition,
                upstream.state,
                upstream.started_at,
            )
            .join(job, job.id == JobDependencyRow.job_id)
            .join(upstream, upstream.id == JobDependencyRow.upstream_id)
            .where(JobDependencyRow.waiting)
        )
        with Session(self._engine) as session:
            return [
                OpenDependency(
                    job_id=job_id,
                    job_state=JobState(job_state),
                    upstream=Upstream(
                        upstream_id, Condition(condition), JobState(up_state), started is not None
                    ),
                )
                for job_id, job_state, upstream_id, condition, up_state, started in session.execute(
                    query
                )
            ]

    def close_dependencies(self, met: Sequence[tuple[int, int]], closed: Sequence[int]) -> None:
        """Mark (job, upstream) pairs met now, and stop every waiting row of `closed` jobs
        (they left PENDING without their conditions: cancelled)."""
        if not met and not closed:
            return
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            if met:
                pairs = [
                    and_(JobDependencyRow.job_id == j, JobDependencyRow.upstream_id == u)
                    for j, u in met
                ]
                session.execute(
                    update(JobDependencyRow)
                    .where(JobDependencyRow.waiting, or_(*pairs))
                    .values(waiting=False, met_at=now)
                )
            if closed:
                session.execute(
                    update(JobDependencyRow)
                    .where(JobDependencyRow.waiting, JobDependencyRow.job_id.in_(closed))
                    .values(waiting=False)
                )

    def links(self, job_id: int) -> Links:
        """The job's upstream and downstream jobs, each in id order."""
        with Session(self._engine) as session:
            return Links(
                upstream=self._linked(session, job_id, upstream=True),
                downstream=self._linked(session, job_id, upstream=False),
            )

    @staticmethod
    def _linked(session: Session, job_id: int, *, upstream: bool) -> list[Link]:
        dep = JobDependencyRow
        mine, other = (dep.job_id, dep.upstream_id) if upstream else (dep.upstream_id, dep.job_id)
        query = (
            select(JobRow.id, JobRow.name, JobRow.state, dep.condition, dep.waiting, dep.met_at)
            .join(JobRow, JobRow.id == other)
            .where(mine == job_id)
            .order_by(JobRow.id)
        )
        return [
            Link(i, name, JobState(state), Condition(condition), waiting, met_at)
            for i, name, state, condition, waiting, met_at in session.execute(query)
        ]
