"""Sweeps: a search over a job's fields whose trials are ordinary jobs.

A sweep row keeps the request (the base job, the space, the searcher and the early-stopping
rule) and its state; a trial row keeps its number, its parameters, its job, the objective
values it reached at each rung, and where it stands (running, paused, completed, stopped,
failed). A trial and its job are written in one transaction, keyed by (sweep, number), so a
controller that dies after asking the searcher and asks again after a restart makes the
same trial at most once. The scheduler loop reads only running sweeps (an index on state).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from scheduler.core.asha import TrialState
from scheduler.store.base import Repository
from scheduler.store.jobs import insert_job
from scheduler.store.records import JobRecord, NewJob, job_record
from scheduler.store.tables import Base, UTCDateTime


class SweepState(enum.StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # the trial budget spent and every trial ended
    FAILED = "FAILED"  # the sweep could not go on (its reason says why)
    CANCELLED = "CANCELLED"


class SweepRow(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    user: Mapped[str] = mapped_column(String(100), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the request, as validated
    state: Mapped[str] = mapped_column(String(20), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class SweepTrialRow(Base):
    __tablename__ = "sweep_trials"

    sweep_id: Mapped[int] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(20))
    rung: Mapped[int] = mapped_column(Integer)  # the rung it works toward, or stopped at
    values: Mapped[dict[str, float]] = mapped_column(JSON)  # rung index (as text) -> value


@dataclass(frozen=True)
class TrialRecord:
    number: int
    job_id: int
    params: dict[str, Any]
    state: TrialState
    rung: int
    values: dict[int, float]  # the objective at each rung reached


@dataclass(frozen=True)
class SweepRecord:
    id: int
    name: str
    user: str
    spec: dict[str, Any]
    state: SweepState
    reason: str
    submitted_at: datetime
    finished_at: datetime | None
    trials: list[TrialRecord]


class SweepNotFound(LookupError):
    def __init__(self, sweep_id: int) -> None:
        super().__init__(f"sweep {sweep_id} not found")
        self.sweep_id = sweep_id


class SweepStore(Repository):
    def create_sweep(self, name: str, user: str, spec: dict[str, Any]) -> SweepRecord:
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            row = SweepRow(
                name=name,
                user=user,
                spec=spec,
                state=SweepState.RUNNING.value,
                reason="submitted",
                submitted_at=now,
            )
            session.add(row)
            session.flush()
            return _sweep(row, [])

    def sweep(self, sweep_id: int) -> SweepRecord:
        with Session(self._engine) as session:
            row = session.get(SweepRow, sweep_id)
            if row is None:
                raise SweepNotFound(sweep_id)
            return _sweep(row, _trials(session, sweep_id))

    def running_sweeps(self) -> list[SweepRecord]:
        """Every sweep the controller still drives, with its trials."""
        with Session(self._engine) as session:
            rows = session.scalars(
                select(SweepRow).where(SweepRow.state == SweepState.RUNNING.value)
            ).all()
            return [_sweep(row, _trials(session, row.id)) for row in rows]

    def sweeps(self, limit: int) -> list[SweepRecord]:
        """The newest sweeps first, without their trials."""
        with Session(self._engine) as session:
            rows = session.scalars(select(SweepRow).order_by(SweepRow.id.desc()).limit(limit))
            return [_sweep(row, []) for row in rows]

    def add_trial(
        self,
        sweep_id: int,
        number: int,
        params: dict[str, Any],
        job: NewJob,
        reason: str,
        *,
        rung: int = 0,
    ) -> tuple[TrialRecord, JobRecord] | None:
        """Trial `number` and its job, working toward `rung` (its bracket's first), in
        one transaction (a number made twice fails);
        None if the sweep is no longer running. The sweep's row is written in the same
        transaction (locked on PostgreSQL), so a trial is never added after the sweep
        ended: a cancel that ended it sees every trial it must stop."""
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            running = session.execute(
                update(SweepRow)
                .where(SweepRow.id == sweep_id, SweepRow.state == SweepState.RUNNING.value)
                .values(state=SweepRow.state)
            )
            if not running.rowcount:  # type: ignore[attr-defined]
                return None
            row = insert_job(session, job, reason, self._clock())
            trial = SweepTrialRow(
                sweep_id=sweep_id,
                number=number,
                job_id=row.id,
                params=params,
                state=TrialState.RUNNING.value,
                rung=rung,
                values={},
            )
            session.add(trial)
            session.flush()
            return _trial(trial), job_record(row)

    def update_trial(
        self,
        sweep_id: int,
        number: int,
        *,
        state: TrialState | None = None,
        rung: int | None = None,
        values: Mapping[int, float] | None = None,
    ) -> None:
        fields: dict[str, Any] = {}
        if state is not None:
            fields["state"] = state.value
        if rung is not None:
            fields["rung"] = rung
        if values is not None:
            fields["values"] = {str(k): v for k, v in values.items()}
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            session.execute(
                update(SweepTrialRow)
                .where(SweepTrialRow.sweep_id == sweep_id, SweepTrialRow.number == number)
                .values(**fields)
            )

    def end_sweep(self, sweep_id: int, state: SweepState, reason: str) -> bool:
        """End a running sweep; False if it had ended already."""
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            done = session.execute(
                update(SweepRow)
                .where(SweepRow.id == sweep_id, SweepRow.state == SweepState.RUNNING.value)
                .values(state=state.value, reason=reason, finished_at=self._clock())
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]


def _trials(session: Session, sweep_id: int) -> list[TrialRecord]:
    rows = session.scalars(
        select(SweepTrialRow)
        .where(SweepTrialRow.sweep_id == sweep_id)
        .order_by(SweepTrialRow.number)
    )
    return [_trial(row) for row in rows]


def _trial(row: SweepTrialRow) -> TrialRecord:
    return TrialRecord(
        number=row.number,
        job_id=row.job_id,
        params=dict(row.params),
        state=TrialState(row.state),
        rung=row.rung,
        values={int(k): float(v) for k, v in row.values.items()},
    )


def _sweep(row: SweepRow, trials: list[TrialRecord]) -> SweepRecord:
    return SweepRecord(
        id=row.id,
        name=row.name,
        user=row.user,
        spec=dict(row.spec),
        state=SweepState(row.state),
        reason=row.reason,
        submitted_at=row.submitted_at,
        finished_at=row.finished_at,
        trials=trials,
    )
