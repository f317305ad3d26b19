"""The scheduling loop: load -> snapshot -> core.schedule -> persist -> executor -> poll.

One instance runs inside `gangway serve`, in its own thread. The store is the source of
truth: every decision is written before the executor acts on it, a job whose state changed
under us (a user cancelled it) wins over what the loop was about to do, and groups whose
job is no longer active in the store are torn down.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import datetime, timedelta

from scheduler.core import Admit, PolicyConfig, Preempt, Resize, Wait, schedule
from scheduler.core.fairshare import decayed_usage
from scheduler.model import (
    ACTIVE_STATES,
    RESOURCE_HOLDING_STATES,
    ClusterSnapshot,
    JobState,
    Node,
    QueueQuota,
)
from scheduler.runtime import metrics
from scheduler.runtime.cluster import ClusterSource
from scheduler.runtime.executor import Executor
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.stragglers import StragglerWatch
from scheduler.runtime.views import gang_shape, job_view, run_info
from scheduler.store import JobRecord, JobRepository, ProgressPoint, StaleState
from scheduler.store.repository import utcnow
from workers.group import GroupPhase, GroupStatus

log = logging.getLogger(__name__)

# States a gang passes through on its way to running or to stopping.
_TRANSITIONAL_STATES = frozenset(
    {JobState.ADMITTED, JobState.STARTING, JobState.PREEMPTING, JobState.RESIZING}
)

# A job holding resources is the one the runtime has (or is about to have) a group for.
_SCHEDULED_STATES = (JobState.PENDING, *sorted(RESOURCE_HOLDING_STATES))


class SchedulerLoop:
    def __init__(
        self,
        *,
        repo: JobRepository,
        cluster: ClusterSource,
        executor: Executor,
        clock: Callable[[], datetime] = utcnow,
        policy: PolicyConfig | None = None,
        queues: Callable[[], Mapping[str, QueueQuota]] = dict,
        fair_share_half_life_s: float = 7 * 24 * 3600.0,
        hang_factor: float = 10.0,
        hang_min_s: float = 300.0,
        suspect_s: float = 300.0,
        stragglers: StragglerWatch | None = None,
        lease: LeaderLease | None = None,
    ) -> None:
        self._repo = repo
        self._cluster = cluster
        self._executor = executor
        self._clock = clock
        self._policy = policy or PolicyConfig()
        self._queues = queues  # read every pass: admins change quotas while it runs
        self._half_life_s = fair_share_half_life_s
        # A running job whose step has not moved for hang_factor x its step time (and at
        # least hang_min_s) is hung: its stacks are kept and it is restarted.
        self._hang_factor = hang_factor
        self._hang_min_s = hang_min_s
        # Nodes where a gang's actors died, and when: not placed on for suspect_s, since
        # Ray may report a dead node alive for a while (its health check is slower).
        self._suspect_s = suspect_s
        self._suspects: dict[str, datetime] = {}
        self._stragglers = stragglers or StragglerWatch()
        self._node_names: dict[str, str] = {}
        self._lease = lease
        self._leading = False

    # -- start-up ---------------------------------------------------------------------

    def reconcile(self) -> None:
        """Match every active job in the store with what Ray runs: reattach or requeue."""
        for job in self._repo.in_states(RESOURCE_HOLDING_STATES):
            if job.state is JobState.RESIZING:
                # The store holds the new placement; the old gang cannot be attached by
                # it, so it goes, and the job resumes from its newest checkpoint.
                self._executor.reap(job)
                self._relaunch(job, "the service restarted during the resize")
                continue
            running = job.state in (JobState.RUNNING, JobState.PREEMPTING)
            if running and self._executor.attach(job):
                log.info("job %s: reattached to its running ranks", job.id)
                continue
            self._requeue(
                job,
                f"the service restarted and found no live ranks for attempt {job.attempt}; "
                "requeued (not counted as a failure)",
            )

    # -- one pass ---------------------------------------------------------------------

    def tick(self) -> bool:
        """One pass; each step is one call (principle 3). True while some gang is on
        its way somewhere (starting, stopping, resizing): the next pass should come soon."""
        with metrics.PASS_SECONDS.time():
            nodes = self._refresh_nodes()
            self._release_inactive_groups()
            jobs = self._repo.in_states(_SCHEDULED_STATES)
            self._apply_decisions(nodes, jobs)
            return self._poll_groups()

    def run(
        self,
        stop: threading.Event,
        interval_s: float,
        *,
        busy_interval_s: float | None = None,
        wake: threading.Event | None = None,
    ) -> None:
        """Tick until `stop` is set; one bad pass is logged, never fatal to the loop.

        Passes come every `interval_s`, every `busy_interval_s` while a gang is in
        transition (each step of a launch waits for a pass: admit, placement, rendezvous,
        start), and at once when `wake` is set (the API sets it on submit and cancel)."""
        wake = wake or threading.Event()
        while not stop.is_set():
            busy = False
            try:
                if self.lead():
                    busy = self.tick()
            except Exception:
                log.exception("scheduling pass failed; retrying next interval")
            wake.wait(busy_interval_s if busy and busy_interval_s else interval_s)
            wake.clear()
        if self._lease is not None and self._leading:
            self._lease.release()

    def lead(self) -> bool:
        """Hold the leader lease (always true without one). A loop that has just become
        the leader reconciles first: the gangs the previous leader ran are reattached."""
        if self._lease is None:
            if not self._leading:
                self.reconcile()
                self._leading = True
            return True
        held = self._lease.hold()
        if held and not self._leading:
            log.info("scheduler lease taken by %s; reconciling", self._lease.holder)
            self.reconcile()
        elif self._leading and not held:
            log.warning("scheduler lease lost; standing by")
        self._leading = held
        return held

    def _refresh_nodes(self) -> list[Node]:
        now = self._clock()
        self._suspects = {
            node: at
            for node, at in self._suspects.items()
            if (now - at).total_seconds() < self._suspect_s
        }
        nodes = [
            replace(node, alive=False) if node.id in self._suspects else node
            for node in self._cluster.nodes()
        ]
        self._repo.replace_nodes(nodes)
        self._node_names = {node.id: node.name for node in nodes}
        return nodes

    def _release_inactive_groups(self) -> None:
        for job_id in self._executor.job_ids():
            if self._repo.get(job_id).state not in RESOURCE_HOLDING_STATES:
                self._executor.release(job_id)

    def _apply_decisions(self, nodes: list[Node], jobs: list[JobRecord]) -> None:
        records = {job.id: job for job in jobs}
        views = [job_view(job) for job in jobs]
        snapshot = ClusterSnapshot(tuple(nodes))
        now = self._clock()
        usage = self._recent_usage(now)
        decisions = schedule(snapshot, views, now, self._policy, queues=self._queues(), usage=usage)
        # Waits come in queue order (schedule's contract): number them.
        waiting = (d.job_id for d in decisions if isinstance(d, Wait))
        positions = {job_id: position for position, job_id in enumerate(waiting, start=1)}
        for decision in decisions:
            if isinstance(decision, Admit):
                self._admit(records[decision.job_id], decision)
            elif isinstance(decision, Preempt):
                self._preempt(records[decision.job_id], decision)
            elif isinstance(decision, Resize):
                self._resize(records[decision.job_id], decision)
            else:
                self._explain(records[decision.job_id], decision, positions[decision.job_id])

    def _recent_usage(self, now: datetime) -> dict[tuple[str, str], float]:
        """Decayed GPU-seconds per (queue, user); runs older than 10 half-lives count < 0.1%."""
        since = now - timedelta(seconds=10 * self._half_life_s)
        return decayed_usage(self._repo.usage_intervals(since), now, self._half_life_s)

    def _explain(self, job: JobRecord, decision: Wait, position: int) -> None:
        """Store why the job waits and its place in the queue; unchanged explanations
        cost no statement (a big queue is explained on every pass)."""
        explanation = {**asdict(decision.explanation), "queue_position": position}
        unchanged = (
            job.status_reason == decision.reason
            and job.estimated_start_at == decision.estimated_start_at
            and job.explanation == explanation
        )
        if unchanged:
            return
        self._repo.explain_wait(
            decision.job_id,
            decision.reason,
            explanation=explanation,
            estimated_start_at=decision.estimated_start_at,
        )

    def _preempt(self, job: JobRecord, decision: Preempt) -> None:
        """Send the stop notice; the gang is released when it exits or at the deadline."""
        preempting = self._transition(
            job, JobState.PREEMPTING, decision.reason, preempt_deadline=decision.deadline
        )
        if preempting.state is JobState.PREEMPTING:
            metrics.PREEMPTIONS.labels(job.queue).inc()
            self._executor.stop(job.id)

    def _resize(self, job: JobRecord, decision: Resize) -> None:
        """Take the new placement in the store at once (the core counts it from now on)
        and send the stop notice; the gang restarts at the new dp once it has saved."""
        deadline = self._clock() + timedelta(seconds=self._policy.checkpoint_grace_s)
        resizing = self._transition(
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

    def _admit(self, job: JobRecord, decision: Admit) -> None:
        try:
            admitted = self._repo.transition(
                job.id,
                JobState.ADMITTED,
                expected=JobState.PENDING,
                reason=decision.reason,
                placement=list(decision.placement.node_ids),
                num_gpus=_gpus(job, decision.placement.node_ids),
                attempt=job.attempt + 1,
                error=None,
                stragglers=None,
                step=0,
                loss=None,
                tokens_per_s=None,
            )
        except StaleState:
            return  # cancelled meanwhile
        self._launch(admitted)

    def _relaunch(self, job: JobRecord, why: str) -> None:
        """A resized job's next attempt, on the placement the store already holds."""
        dp = gang_shape(job.spec, job.placement).parallelism.dp
        admitted = self._transition(
            job,
            JobState.ADMITTED,
            f"{why}; relaunching at dp={dp}",
            attempt=job.attempt + 1,
            preempt_deadline=None,
            error=None,
            stragglers=None,
        )
        if admitted.state is JobState.ADMITTED:
            self._launch(admitted)

    def _launch(self, admitted: JobRecord) -> None:
        try:
            self._executor.launch(admitted)
        except Exception as exc:
            log.exception("job %s: launch failed", admitted.id)
            self._requeue(admitted, f"could not launch on Ray: {exc}")
            return
        ranks = len(admitted.placement or ())
        self._transition(
            admitted, JobState.STARTING, f"placement group requested; starting {ranks} ranks"
        )

    # -- polling ----------------------------------------------------------------------

    def _poll_groups(self) -> bool:
        """Observe every group; True if one is still on its way (see `tick`)."""
        self._stragglers.keep_only(self._executor.job_ids())
        busy = False
        for job_id, status in self._executor.poll().items():
            job = self._repo.get(job_id)
            busy = busy or job.state in _TRANSITIONAL_STATES
            if job.state is JobState.PREEMPTING:
                self._observe_preempting(job, status)
            elif job.state is JobState.RESIZING:
                self._observe_resizing(job, status)
            elif job.state in ACTIVE_STATES:
                self._observe(job, status)
            else:
                self._executor.release(job_id)
        return busy

    def _record_progress(self, job: JobRecord, status: GroupStatus) -> None:
        self._repo.append_logs(job.id, job.attempt, status.logs)
        if status.step != job.step:
            point = ProgressPoint(
                step=status.step,
                loss=status.loss,
                first_loss=status.first_loss,
                tokens_per_s=status.tokens_per_s,
                step_time_s=status.step_time_s,
                memory_mb=status.memory_mb,
                comm_s=status.comm_s,
                comm_bytes=status.comm_bytes,
            )
            self._repo.record_progress(job.id, job.attempt, point)
            self._watch_stragglers(job, status)

    def _watch_stragglers(self, job: JobRecord, status: GroupStatus) -> None:
        """Flag ranks persistently slower than their peers (and unflag them), once per
        change: the job's `stragglers` and an event that keeps its state."""
        found = self._stragglers.observe(job.id, job.attempt, status.rank_local_s)
        if found is None or job.placement is None:
            return
        if [s.rank for s in found] == [s["rank"] for s in job.stragglers]:
            return
        nodes = [job.placement[s.rank] for s in found]
        flagged = [
            {
                "rank": s.rank,
                "node_id": node,
                "local_s": round(s.local_s, 4),
                "ratio": round(s.ratio, 2),
            }
            for s, node in zip(found, nodes, strict=True)
        ]
        described = "; ".join(
            f"rank {s.rank} on {self._node_names.get(node, node)} needs {s.local_s:.3f} s "
            f"of local work per step, {s.ratio:.1f}x the gang's median"
            for s, node in zip(found, nodes, strict=True)
        )
        reason = (
            f"straggler: {described} (median over the last {self._stragglers.window} polls)"
            if found
            else f"no straggler: every rank within {self._stragglers.factor:g}x of the median"
        )
        self._repo.annotate(job.id, reason, stragglers=flagged)

    def _observe(self, job: JobRecord, status: GroupStatus) -> None:
        self._record_progress(job, status)
        if status.ranks_started and job.state is JobState.STARTING:
            job = self._transition(
                job, JobState.RUNNING, f"all {len(job.placement or ())} ranks started"
            )
            if job.state is not JobState.RUNNING:
                return
            if job.attempt == 1 and job.started_at is not None:
                waited = (job.started_at - job.submitted_at).total_seconds()
                metrics.SUBMIT_TO_START_SECONDS.labels(job.queue).observe(waited)
        if status.phase is GroupPhase.SUCCEEDED:
            self._executor.release(job.id)
            self._transition(job, JobState.SUCCEEDED, f"all ranks finished at step {status.step}")
        elif status.phase is GroupPhase.FAILED:
            self._executor.release(job.id)
            for node in status.lost_nodes:
                self._suspects[node] = self._clock()
            self._fail_or_restart(job, status.error or "the gang failed", status)
        elif status.phase is GroupPhase.PLACEMENT_TIMEOUT:
            self._executor.release(job.id)
            self._requeue(job, status.error or "placement timed out")
        elif (hang := self._hang(job, status)) is not None:
            stacks = self._executor.stacks(job.id)
            self._executor.release(job.id)
            self._fail_or_restart(job, f"{stacks}\n{hang}", status)
        elif self._over_time_limit(job):
            self._executor.release(job.id)
            limit = job.spec.get("time_limit_s")
            self._transition(
                job,
                JobState.FAILED,
                f"time limit of {limit} s exceeded",
                error="time limit exceeded",
            )

    def _hang(self, job: JobRecord, status: GroupStatus) -> str | None:
        """Why the job counts as hung, or None. Only a job that has stepped in this
        attempt is judged (start-up and checkpoint loading have no step time to go by)."""
        run = run_info(job)
        if (
            job.state is not JobState.RUNNING
            or status.step != job.step
            or run is None
            or run.step_time_s is None
            or job.progress_at is None
            or job.progress_at < run.started_at
        ):
            return None
        limit = max(self._hang_min_s, self._hang_factor * run.step_time_s)
        silent = (self._clock() - job.progress_at).total_seconds()
        if silent <= limit:
            return None
        return (
            f"hung: no progress past step {job.step} for {silent:.0f} s (limit {limit:.0f} s "
            f"= max({self._hang_min_s:.0f} s, {self._hang_factor:g} x step time "
            f"{run.step_time_s:.2f} s)); every rank's stacks are above"
        )

    def _observe_preempting(self, job: JobRecord, status: GroupStatus) -> None:
        """Requeue once the ranks have stopped, or at the deadline (then they are killed)."""
        stopped = self._stopped(job, status)
        if stopped is None:
            return
        where, resume = stopped
        self._transition(
            job,
            JobState.PENDING,
            f"{where} and requeued; {resume}",
            placement=None,
            preempt_deadline=None,
        )

    def _observe_resizing(self, job: JobRecord, status: GroupStatus) -> None:
        """Relaunch at the new placement once the ranks have saved and exited (or at the
        deadline, from the checkpoint before). A rank that crashed is a failure."""
        if status.phase is GroupPhase.FAILED:
            self._record_progress(job, status)
            self._executor.release(job.id)
            self._fail_or_restart(job, status.error or "the gang failed while resizing", status)
            return
        stopped = self._stopped(job, status)
        if stopped is not None:
            self._relaunch(job, "; ".join(stopped))

    def _stopped(self, job: JobRecord, status: GroupStatus) -> tuple[str, str] | None:
        """For a gang sent the stop notice: None while it may still stop on its own;
        otherwise release it and say where it stopped and what it resumes from (a job
        that finished meanwhile succeeds, and the answer is None too)."""
        self._record_progress(job, status)
        exited = status.phase in (GroupPhase.SUCCEEDED, GroupPhase.FAILED)
        deadline = job.preempt_deadline
        if not exited and (deadline is None or self._clock() < deadline):
            return None
        self._executor.release(job.id)
        finished = job.total_steps is not None and status.step >= job.total_steps
        if status.phase is GroupPhase.SUCCEEDED and finished:
            self._transition(
                job, JobState.SUCCEEDED, f"finished at step {status.step} while stopping"
            )
            return None
        lost = _lost_steps(status)
        metrics.LOST_STEPS.labels(job.queue).inc(lost)
        how = (
            f"stopped at step {status.step}"
            if exited
            else f"killed at the deadline at step {status.step}"
        )
        if exited and status.stop_ack_s is not None:
            how += f" ({status.stop_ack_s:.1f} s after the notice)"
        saved = status.checkpoint_step
        resume = (
            f"resumes from its checkpoint at step {saved} ({lost} steps lost)"
            if saved is not None
            else f"no checkpoint, so it restarts from step 0 ({lost} steps lost)"
        )
        return how, resume

    def _fail_or_restart(self, job: JobRecord, error: str, status: GroupStatus) -> None:
        max_restarts = int(job.spec.get("max_restarts", 0))
        if job.restarts >= max_restarts:
            reason = f"failed after {job.restarts} restart(s): {error.splitlines()[-1]}"
            self._transition(job, JobState.FAILED, reason, error=error)
            return
        metrics.RESTARTS.labels(job.queue).inc()
        metrics.LOST_STEPS.labels(job.queue).inc(_lost_steps(status))
        restarting = self._transition(
            job,
            JobState.RESTARTING,
            f"restart {job.restarts + 1} of {max_restarts}: {error.splitlines()[-1]}",
            restarts=job.restarts + 1,
            error=error,
        )
        self._transition(restarting, JobState.PENDING, "requeued to be placed again")

    def _over_time_limit(self, job: JobRecord) -> bool:
        limit = job.spec.get("time_limit_s")
        if limit is None or job.started_at is None or job.state is not JobState.RUNNING:
            return False
        return (self._clock() - job.started_at).total_seconds() > float(limit)

    # -- helpers ----------------------------------------------------------------------

    def _requeue(self, job: JobRecord, reason: str) -> None:
        self._executor.release(job.id)
        self._transition(job, JobState.PENDING, reason, placement=None)

    def _transition(
        self, job: JobRecord, new_state: JobState, reason: str, **fields: object
    ) -> JobRecord:
        """Transition from the state we saw; if someone else moved the job, they win."""
        try:
            return self._repo.transition(
                job.id, new_state, reason=reason, expected=job.state, **fields
            )
        except StaleState as exc:
            log.info("job %s: %s; leaving it to the newer state", job.id, exc)
            self._executor.release(job.id)
            return self._repo.get(job.id)


def _gpus(job: JobRecord, placement: Sequence[str]) -> int:
    """GPUs a placement of this job holds (an elastic job's count follows its dp)."""
    return len(placement) * gang_shape(job.spec).gpus_per_rank


def _lost_steps(status: GroupStatus) -> int:
    """Steps done since the newest checkpoint: the next attempt does them again."""
    return max(0, status.step - (status.checkpoint_step or 0))
