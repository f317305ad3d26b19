"""Writes the scheduler's decisions and the lifecycle's transitions, then acts on Ray.

Every change is written to the store before the executor acts on it (the store is the
source of truth), and a transition is conditional on the state the loop saw: if a user
cancelled the job meanwhile, their change wins and the gang is let go.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timedelta

from scheduler.core import Admit, PolicyConfig, Preempt, Resize, Wait
from scheduler.model import JobState
from scheduler.runtime import metrics
from scheduler.runtime.executor import Executor
from scheduler.runtime.lifecycle import NEW_ATTEMPT, Transition
from scheduler.store import Fenced, JobRecord, JobRepository, StaleState, WaitNote
from workers import faults

log = logging.getLogger(__name__)

Decision = Admit | Preempt | Resize | Wait

# A waiting job's stored place in the queue may lag its true place by this fraction for
# at most this long (see `Applier._position_can_wait`).
POSITION_SLACK = 0.1
POSITION_REFRESH = timedelta(seconds=10)


class Applier:
    def __init__(
        self,
        repo: JobRepository,
        executor: Executor,
        clock: Callable[[], datetime],
        policy: PolicyConfig,
        suspect: Callable[[str], str],
        *,
        written: Callable[[JobRecord], None] = lambda record: None,
    ) -> None:
        self._repo = repo
        self._executor = executor
        self._clock = clock
        self._policy = policy
        self._suspect = suspect  # a node where ranks were lost: marked, its name returned
        self._written = written  # every row a transition returned, as it now stands
        # job id -> (row version, the Wait and position) the row was seen to hold already:
        # the next pass with the same row and the same Wait skips building the comparison.
        self._explained: dict[int, tuple[int, Wait, int]] = {}
        self._positioned_at: dict[int, datetime] = {}  # when this loop last wrote a place

    # -- the core's decisions -----------------------------------------------------------

    def decisions(
        self, records: Mapping[int, JobRecord], decisions: Sequence[Decision]
    ) -> tuple[list[WaitNote], dict[int, int]]:
        """Act on every decision; the wait notes written and the versions they gave the
        rows (see `explain_waits`), for the loop's working set."""
        # Waits come in queue order (schedule's contract): number them.
        waiting = (d.job_id for d in decisions if isinstance(d, Wait))
        positions = {job_id: position for position, job_id in enumerate(waiting, start=1)}
        notes: list[WaitNote] = []
        for decision in decisions:
            job = records[decision.job_id]
            if isinstance(decision, Admit):
                self._admit(job, decision)
            elif isinstance(decision, Preempt):
                self._preempt(job, decision)
            elif isinstance(decision, Resize):
                self._resize(job, decision)
            elif note := self._changed_note(job, decision, positions[decision.job_id]):
                notes.append(note)
        versions = self._repo.explain_waits(notes)
        if len(self._explained) > len(positions):  # some job no longer waits
            self._explained = {j: seen for j, seen in self._explained.items() if j in positions}
        if len(self._positioned_at) > len(positions):
            self._positioned_at = {j: a for j, a in self._positioned_at.items() if j in positions}
        return notes, versions

    def _changed_note(self, job: JobRecord, decision: Wait, position: int) -> WaitNote | None:
        """Why the job waits and its place in the queue, unless the store has that already
        (a big queue is explained on every pass; unchanged explanations cost nothing)."""
        seen = (job.version, decision, position)
        if self._explained.get(job.id) == seen:
            return None
        why = asdict(decision.explanation)
        stored = dict(job.explanation or {})
        old_position = stored.pop("queue_position", None)
        same_otherwise = (
            job.status_reason == decision.reason
            and job.estimated_start_at == decision.estimated_start_at
            and stored == why
        )
        if same_otherwise and old_position == position:
            self._explained[job.id] = seen
            return None
        if same_otherwise and self._position_can_wait(job.id, old_position, position):
            return None
        self._positioned_at[job.id] = self._clock()
        return WaitNote(
            job.id,
            decision.reason,
            {**why, "queue_position": position},
            decision.estimated_start_at,
            job.version,
        )

    def _position_can_wait(self, job_id: int, old: object, new: int) -> bool:
        """Only the job's place moved, by less than `POSITION_SLACK` of it, and this loop
        wrote it within `POSITION_REFRESH`: twenty submits near the head of a 10,000-job
        queue would otherwise rewrite every row behind them on every pass. A place within
        the first ten is always exact (one step is 10% of it)."""
        written = self._positioned_at.get(job_id)
        return (
            isinstance(old, int)
            and abs(new - old) < POSITION_SLACK * old
            and written is not None
            and self._clock() - written < POSITION_REFRESH
        )

    def _preempt(self, job: JobRecord, decision: Preempt) -> None:
        """Send the stop notice; the gang is released when it exits or at the deadline."""
        preempting = self.transition(
            job, JobState.PREEMPTING, decision.reason, preempt_deadline=decision.deadline
        )
        if preempting.state is JobState.PREEMPTING:
            metrics.PREEMPTIONS.labels(job.queue).inc()
            self._executor.stop(job.id)
            faults.inject("scheduler.preempted")

    def pause(self, job: JobRecord, hold: str, reason: str) -> JobRecord:
        """Stop a running gang with its checkpoint, as a preemption does, and hold the job:
        it returns to PENDING and waits there until released (a sweep's paused trial)."""
        deadline = self._clock() + timedelta(seconds=self._policy.checkpoint_grace_s)
        paused = self.transition(
            job, JobState.PREEMPTING, reason, preempt_deadline=deadline, hold=hold
        )
        if paused.state is JobState.PREEMPTING:
            self._executor.stop(job.id)
        return paused

    def _resize(self, job: JobRecord, decision: Resize) -> None:
        """Take the new placement in the store at once (the core counts it from now on)
        and send the stop notice; the gang restarts at the new dp once it has saved."""
        deadline = self._clock() + timedelta(seconds=self._policy.checkpoint_grace_s)
        resizing = self.transition(
            job,
            JobState.RESIZING,
            f"{decision.reason}; checkpointing to restart at dp={decision.dp}",
            placement=list(decision.placement.node_ids),
            num_gpus=_gpus(job, decision.placement.node_ids),
            preempt_deadline=deadline,
        )
        if resizing.state is JobState.RESIZING:
            metrics.RESIZES.labels(job.queue).inc()
            self._executor.stop(job.id)
            faults.inject("scheduler.resizing")

    def _admit(self, job: JobRecord, decision: Admit) -> None:
        try:
            admitted = self._repo.transition(
                job.id,
                JobState.ADMITTED,
                expected=JobState.PENDING,
                expected_attempt=job.attempt,
                reason=decision.reason,
                placement=list(decision.placement.node_ids),
                num_gpus=_gpus(job, decision.placement.node_ids),
                attempt=job.attempt + 1,
                step=0,
                loss=None,
                **NEW_ATTEMPT,
            )
        except StaleState:
            return  # cancelled meanwhile
        self._written(admitted)
        self.launch(admitted)

    # -- the lifecycle's transitions ----------------------------------------------------

    def apply(self, job: JobRecord, change: Transition) -> JobRecord:
        """Write one lifecycle transition (and the one chained after it) and act on it."""
        fields = dict(change.fields)
        if change.with_stacks:
            fields["error"] = f"{self._executor.stacks(job.id)}\n{fields.get('error', '')}"
        if change.release:
            self._executor.release(job.id)
        lost = [self._suspect(node) for node in change.suspect_nodes]
        reason = change.reason
        if lost:  # the hosts that died or went silent, by name
            reason = f"{reason} (lost node{'s' if len(lost) > 1 else ''}: {', '.join(lost)})"
        if change.lost_steps:
            metrics.LOST_STEPS.labels(job.queue).inc(change.lost_steps)
        if change.to is JobState.RESTARTING:
            metrics.RESTARTS.labels(job.queue).inc()
        moved = self.transition(job, change.to, reason, **fields)
        if moved.state is not change.to:
            return moved
        if change.to is JobState.RUNNING:
            self._count_first_start(moved)
        if change.relaunch:
            self.launch(moved)
        if change.then is not None:
            return self.apply(moved, change.then)
        return moved

    @staticmethod
    def _count_first_start(job: JobRecord) -> None:
        if job.attempt == 1 and job.started_at is not None:
            waited = (job.started_at - job.submitted_at).total_seconds()
            metrics.SUBMIT_TO_START_SECONDS.labels(job.queue).observe(waited)

    # -- acting on Ray ------------------------------------------------------------------

    def launch(self, admitted: JobRecord) -> None:
        faults.inject("scheduler.launch")  # a leader paused between admitting and launching
        try:
            self._executor.launch(admitted)
        except Fenced:
            raise
        except Exception as exc:
            log.exception("job %s: launch failed", admitted.id)
            self.requeue(admitted, f"could not launch on Ray: {exc}")
            return
        faults.inject("scheduler.launched")  # the gang requested, the store not told yet
        ranks = len(admitted.placement or ())
        self.transition(
            admitted, JobState.STARTING, f"placement group requested; starting {ranks} ranks"
        )

    def requeue(self, job: JobRecord, reason: str) -> None:
        self._executor.release(job.id)
        self.transition(job, JobState.PENDING, reason, placement=None)

    def transition(
        self, job: JobRecord, new_state: JobState, reason: str, **fields: object
    ) -> JobRecord:
        """Transition from the state we saw; if someone else moved the job, they win."""
        try:
            moved = self._repo.transition(
                job.id,
                new_state,
                reason=reason,
                expected=job.state,
                expected_attempt=job.attempt,
                **fields,
            )
        except StaleState as exc:
            log.info("job %s: %s; leaving it to the newer state", job.id, exc)
            self._executor.release(job.id)
            moved = self._repo.get(job.id)
        self._written(moved)
        return moved


def _gpus(job: JobRecord, placement: Sequence[str]) -> int:
    """GPUs a placement of this job holds (an elastic job's count follows its dp)."""
    return len(placement) * job.spec.shape.gpus_per_rank
