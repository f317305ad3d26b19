"""Jobs, their events and idempotency keys: one aggregate, written together.

State changes go through `transition` only: it checks the old state in the UPDATE's WHERE
clause (a compare-and-set, safe against a concurrent writer) and writes the event row in
the same transaction, so the event log can never disagree with the job's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, bindparam, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.model import JobState, is_legal_transition
from scheduler.store.job_reads import JobReads
from scheduler.store.records import (
    IllegalTransition,
    JobEnded,
    JobNotFound,
    JobRecord,
    KeyReused,
    NewJob,
    StaleState,
    Step,
    WaitNote,
    job_record,
    job_row,
)
from scheduler.store.tables import (
    JobDependencyRow,
    JobEventRow,
    JobRow,
    fresh_versions,
    written_version,
)
from scheduler.store.text_limits import MAX_REASON_CHARS, bounded_fields, keep_tail

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


class JobStore(JobReads):
    """Writes: submit (with idempotency), transitions, explanations and notes."""

    def create(self, new: NewJob, *, reason: str = "submitted") -> JobRecord:
        if any(isinstance(upstream, Step) for upstream, _ in new.depends_on):
            raise ValueError("a job outside a pipeline names its upstream jobs by id")
        with Session(self._engine) as session, session.begin():
            row = insert_job(session, new, reason, self._clock())
            return job_record(row)

    def create_once(self, new: NewJob, *, reason: str = "submitted") -> tuple[JobRecord, bool]:
        """`create`, unless `new.user` already submitted a job with `new.idempotency_key`: then
        that job, and False. A key sent again with another body raises `KeyReused`.
        The insert relies on the unique index (the API looks a key up first, `replayed`,
        so a retry skips the checks; two racing requests both miss there): it refuses a
        key seen before, or the loser of the race, and that one then finds the job that
        won."""
        key = new.idempotency_key
        if key is None:
            return self.create(new, reason=reason), True
        try:
            return self.create(new, reason=reason), True
        except IntegrityError:
            found = self.replayed(new.user, key, new.request_digest)
            if found is None:
                raise
        return found, False

    def replayed(self, user: str, key: str, digest: str | None) -> JobRecord | None:
        """The job `user` first submitted with `key`, if any (None: a fresh key); a key
        sent again with another body (`digest`) raises `KeyReused`."""
        found = self._by_idempotency_key(user, key)
        if found is None:
            return None
        record, first = found
        if first != digest:
            raise KeyReused(key, record.id)
        return record

    def _by_idempotency_key(self, user: str, key: str) -> tuple[JobRecord, str | None] | None:
        """Keys are the submitting user's own: another user's same key is another job."""
        with Session(self._engine) as session:
            query = select(JobRow).where(JobRow.user == user, JobRow.idempotency_key == key)
            row = session.scalars(query).first()
            return (job_record(row), row.request_digest) if row is not None else None

    def transition(
        self,
        job_id: int,
        new_state: JobState,
        *,
        reason: str,
        expected: JobState | None = None,
        expected_attempt: int | None = None,
        **fields: Any,
    ) -> JobRecord:
        """Move a job to `new_state`, writing an event row; the only way state changes.

        `expected` pins the old state and `expected_attempt` the attempt (raise
        `StaleState` if either is something else: a move meant for one attempt never
        lands on the next). `fields` are other columns to set in the same UPDATE.
        """
        now = self._clock()
        reason, fields = keep_tail(reason, MAX_REASON_CHARS), bounded_fields(fields)
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            row = job_row(session, job_id)
            old = JobState(row.state)
            if expected is not None and old is not expected:
                raise StaleState(job_id, expected, old)
            if expected_attempt is not None and row.attempt != expected_attempt:
                detail = f" at attempt {row.attempt}, not {expected_attempt}"
                raise StaleState(job_id, old, old, detail)
            if not is_legal_transition(old, new_state):
                raise IllegalTransition(job_id, old, new_state)
            values: dict[str, Any] = {
                "state": new_state.value,
                "updated_at": now,
                "version": JobRow.version + 1,
                **fields,
            }
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
                .where(JobRow.attempt == row.attempt)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                raise StaleState(job_id, old, _current_state(session, job_id))
            session.add(
                JobEventRow(
                    job_id=job_id,
                    at=now,
                    from_state=old.value,
                    to_state=new_state.value,
                    reason=reason,
                    generation=self.generation,
                )
            )
            session.flush()
            session.expire_all()
            fresh = session.get(JobRow, job_id)
            assert fresh is not None
            return job_record(fresh)

    def explain_wait(
        self,
        job_id: int,
        reason: str,
        *,
        explanation: dict[str, Any] | None = None,
        estimated_start_at: datetime | None = None,
    ) -> None:
        """`explain_waits` for one job."""
        self.explain_waits([WaitNote(job_id, reason, explanation, estimated_start_at)])

    def explain_waits(self, notes: Sequence[WaitNote]) -> dict[int, int]:
        """Record why pending jobs wait and when each should start (no event: it is not
        a state change), all in one transaction: a pass that re-explains thousands of
        waits pays one commit and one fence check. A job no longer pending keeps what it
        has. The caller leaves out notes that would change nothing.

        A note that carries the version its writer read (`seen_version`) applies only
        while the row still has it, and gives the row the version returned for its job
        (`tables.fresh_versions`): the writer can patch its copy instead of rereading."""
        now = self._clock()
        fresh = fresh_versions(n.job_id for n in notes if n.seen_version is not None)
        seen = bindparam("note_seen", type_=BigInteger())
        statement = (
            update(JobRow)
            .where(JobRow.id == bindparam("note_id"), JobRow.state == JobState.PENDING.value)
            .where(or_(seen == -1, JobRow.version == seen))  # a note read at a version
            .values(
                status_reason=bindparam("note_reason"),
                explanation=bindparam("note_explanation", type_=JobRow.explanation.type),
                estimated_start_at=bindparam("note_start", type_=JobRow.estimated_start_at.type),
                updated_at=now,
                version=written_version(seen, bindparam("note_version", type_=BigInteger())),
            )
        )
        rows = [
            {
                "note_id": note.job_id,
                "note_reason": keep_tail(note.reason, MAX_REASON_CHARS),
                "note_explanation": note.explanation,
                "note_start": note.estimated_start_at,
                "note_seen": -1 if note.seen_version is None else note.seen_version,
                "note_version": fresh.get(note.job_id, -1),
            }
            for note in notes
        ]
        if not rows:
            return fresh
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            session.connection().execute(statement, rows)
        return fresh

    def annotate(self, job_id: int, reason: str, **fields: Any) -> JobRecord:
        """Set `fields` and say so in an event that keeps the state (from = to): not a
        state change (a priority change, a straggler flagged), but something the job's
        owner should find in its timeline. A job that already ended is not changed: 409."""
        now = self._clock()
        reason, fields = keep_tail(reason, MAX_REASON_CHARS), bounded_fields(fields)
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            row = job_row(session, job_id)
            state = JobState(row.state)
            if state.is_terminal:
                raise JobEnded(job_id, state)
            for name, value in fields.items():
                setattr(row, name, value)
            row.updated_at = now
            row.version = JobRow.version + 1  # in SQL: no lost bump
            session.add(
                JobEventRow(
                    job_id=job_id,
                    at=now,
                    from_state=state,
                    to_state=state,
                    reason=reason,
                    generation=self.generation,
                )
            )
            session.flush()
            return job_record(row)


def insert_job(
    session: Session,
    new: NewJob,
    reason: str,
    now: datetime,
    *,
    pipeline_id: int | None = None,
    steps: Sequence[int] = (),
) -> JobRow:
    """The job's row, its first event and its dependencies; `steps`: the ids of the
    batch's earlier jobs, for upstream jobs named by their place in it."""
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
        pipeline_id=pipeline_id,
    )
    session.add(row)
    session.flush()
    session.add(
        JobEventRow(job_id=row.id, at=now, from_state=None, to_state=row.state, reason=reason)
    )
    session.add_all(
        JobDependencyRow(
            job_id=row.id,
            upstream_id=steps[upstream.index] if isinstance(upstream, Step) else upstream,
            condition=condition.value,
            waiting=True,
        )
        for upstream, condition in new.depends_on
    )
    session.flush()
    return row


def _current_state(session: Session, job_id: int) -> JobState:
    """The state another writer left; the job may have been deleted meanwhile (404)."""
    state = session.scalar(select(JobRow.state).where(JobRow.id == job_id))
    if state is None:
        raise JobNotFound(job_id)
    return JobState(state)
