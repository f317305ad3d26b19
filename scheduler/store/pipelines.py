"""Pipelines: jobs submitted together, all or none, as the named steps of a group.

A step may wait for earlier steps and start from their results; those are named in its
body by step name, since no step has an id before the batch is written. `create_pipeline`
writes the group and every step in one transaction, in order, giving each step's body the
ids of the steps it names (`specs.with_step_ids`), so a stored job says exactly which jobs
it waited for and started from, as any other job's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.store.base import Repository
from scheduler.store.jobs import insert_job
from scheduler.store.records import JobRecord, NewJob, job_record
from scheduler.store.specs import with_step_ids
from scheduler.store.tables import JobRow, PipelineRow


class PipelineNotFound(LookupError):
    def __init__(self, pipeline_id: int) -> None:
        super().__init__(f"pipeline {pipeline_id} not found")
        self.pipeline_id = pipeline_id


@dataclass(frozen=True)
class PipelineRecord:
    id: int
    name: str
    user: str
    submitted_at: datetime
    jobs: list[JobRecord]  # its steps, in the order they were given


class PipelineStore(Repository):
    def create_pipeline(self, name: str, user: str, steps: Sequence[NewJob]) -> PipelineRecord:
        """The pipeline and its steps, all written or none. A step's upstream jobs may be
        earlier steps (`records.Step`), and its body may name them by step name."""
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            self._guard(session)  # the loop stores calibration runs: only while it leads
            group = PipelineRow(name=name, user=user, submitted_at=now)
            session.add(group)
            session.flush()
            rows: list[JobRow] = []
            for new in steps:
                named = {row.name: row.id for row in rows}
                body = with_step_ids(new.spec, named)
                reason = f"submitted as step {new.name!r} of pipeline {group.id} ({name})"
                row = insert_job(
                    session,
                    replace(new, spec=body),
                    reason,
                    now,
                    pipeline_id=group.id,
                    steps=[r.id for r in rows],
                )
                rows.append(row)
            return PipelineRecord(group.id, name, user, now, [job_record(r) for r in rows])

    def pipeline(self, pipeline_id: int) -> PipelineRecord:
        with Session(self._engine) as session:
            group = session.get(PipelineRow, pipeline_id)
            if group is None:
                raise PipelineNotFound(pipeline_id)
            jobs = session.scalars(
                select(JobRow).where(JobRow.pipeline_id == pipeline_id).order_by(JobRow.id)
            )
            return PipelineRecord(
                group.id, group.name, group.user, group.submitted_at, [job_record(r) for r in jobs]
            )
