"""The scheduling loop: load -> snapshot -> core.schedule -> persist -> executor -> poll.

One instance runs inside `gangway serve`, in its own thread. The store is the source of
truth: every decision is written before the executor acts on it, a job whose state changed
under us (a user cancelled it) wins over what the loop was about to do, and groups whose
job is no longer active in the store are torn down.

The loop only sequences the parts, each in its own module: `nodes` (Ray's nodes minus
suspects), `calibration` (short runs that measure an unmeasured node type, once),
`sweeps` (trials recorded, paused, promoted, started), `dependencies` (jobs held for
jobs, hopeless ones cancelled), `applier` (decisions and transitions written, then
acted on), `lifecycle` (the pure rules for what a gang's report means), `ingest`
(progress, logs, stragglers) and `leadership` (lease and reconcile).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from scheduler.core import PolicyConfig, schedule
from scheduler.core.dependencies import Upstream
from scheduler.core.fairshare import HALF_LIFE_S, decayed_usage
from scheduler.model import (
    RESOURCE_HOLDING_STATES,
    ClusterSnapshot,
    JobState,
    JobView,
    Node,
    QueueQuota,
)
from scheduler.predict.steptime import NodeType
from scheduler.runtime import metrics
from scheduler.runtime.applier import Applier
from scheduler.runtime.calibration import AutoCalibration
from scheduler.runtime.cluster import ClusterSource, DriverNodeLost
from scheduler.runtime.dependencies import DependencyGate
from scheduler.runtime.executor import Executor, GuardedExecutor
from scheduler.runtime.gangs.status import GroupStatus
from scheduler.runtime.ingest import ProgressIngest
from scheduler.runtime.leadership import SWEEP_EVERY_PASSES, Leadership
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.lifecycle import LifecycleConfig, next_transition, quiet_until
from scheduler.runtime.nodes import NodeWatch
from scheduler.runtime.predictions import Predictions
from scheduler.runtime.stragglers import StragglerWatch
from scheduler.runtime.sweeps import SweepController
from scheduler.runtime.trainer_shapes import common_node_type, gpu_node_types
from scheduler.runtime.working_set import WorkingSet
from scheduler.store import Fenced, FenceSlot, JobRecord, JobRepository, ProgressNote
from scheduler.store.base import utcnow
from workers import faults

log = logging.getLogger(__name__)

# States a gang passes through on its way to running or to stopping.
_TRANSITIONAL_STATES = frozenset(
    {JobState.ADMITTED, JobState.STARTING, JobState.PREEMPTING, JobState.RESIZING}
)

# A job holding resources is the one the runtime has (or is about to have) a group for.
_SCHEDULED_STATES = (JobState.PENDING, *sorted(RESOURCE_HOLDING_STATES))

# Fair-share usage is derived again at least this often while no job changes.
_USAGE_EVERY = timedelta(seconds=10)

# STARTING -> RUNNING -> SUCCEEDED can all follow from one report; no chain is longer.
_MAX_TRANSITIONS_PER_REPORT = 3


def _with_expendable(views: list[JobView], expendable: Mapping[int, float]) -> list[JobView]:
    """The views with each running sweep trial's place at its rung (few jobs; the rest
    are the views as kept)."""
    if not expendable:
        return views
    return [replace(v, expendable=expendable[v.id]) if v.id in expendable else v for v in views]


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
        fair_share_half_life_s: float = HALF_LIFE_S,
        lifecycle: LifecycleConfig | None = None,
        suspect_s: float = 300.0,
        stragglers: StragglerWatch | None = None,
        lease: LeaderLease | None = None,
        sweep_every: int = SWEEP_EVERY_PASSES,
        auto_calibrate: bool = False,
    ) -> None:
        # With a lease, every write and Ray action is fenced by the lease's generation.
        fence = FenceSlot()
        if lease is not None:
            repo = repo.fenced(fence)
            executor = GuardedExecutor(executor, lambda: lease.guard(fence))
        self._repo = repo
        self._executor = executor
        self._clock = clock
        self._policy = policy or PolicyConfig()
        self._queues = queues  # read every pass: admins change quotas while it runs
        self._half_life_s = fair_share_half_life_s
        self._lifecycle = lifecycle or LifecycleConfig()
        self._predictions = Predictions(repo)
        self._nodes = NodeWatch(
            repo, cluster, clock, suspect_s, speeds=self._predictions.gpu_speeds
        )
        self._jobs = WorkingSet(repo, _SCHEDULED_STATES)
        self._applier = Applier(
            repo, executor, clock, self._policy, self._nodes.suspect, written=self._jobs.written
        )
        self._dependencies = DependencyGate(repo, self._jobs.written)
        self._sweeps = SweepController(repo, self._applier, clock)
        self._ingest = ProgressIngest(repo, stragglers or StragglerWatch())
        self._leadership = Leadership(
            repo,
            executor,
            self._applier,
            lease,
            nodes=self._nodes,
            fence=fence,
            sweep_every=sweep_every,
        )
        self._calibration = AutoCalibration(repo) if auto_calibrate else None
        self._usage: tuple[int, datetime, dict[tuple[str, str], float]] | None = None
        # job id -> (row version, report, until): a report the lifecycle found nothing in,
        # which it will not find anything in before `until` while both stay the same.
        self._quiet: dict[int, tuple[int, GroupStatus, datetime | None]] = {}

    def reconcile(self) -> None:
        """Match every active job in the store with what Ray runs: reattach or requeue."""
        self._leadership.reconcile()

    def lead(self) -> bool:
        """Hold the leader lease; a loop that has just become leader reconciles first."""
        return self._leadership.lead()

    # -- one pass ---------------------------------------------------------------------

    def tick(self) -> bool:
        """One pass; each step is one call (principle 3). True while some gang is on
        its way somewhere (starting, stopping, resizing): the next pass should come soon."""
        with metrics.PASS_SECONDS.time():
            nodes = self._nodes.refresh()  # 1. Ray's nodes, suspects marked dead
            self._calibrate(nodes)  # 1b. once, where the nodes' type is not yet measured
            self._sweeps.advance()  # 2. sweeps: trials recorded, paused, promoted, started
            jobs = self._jobs.load()  # 3. what the core decides on (what changed, reloaded)
            jobs, waiting = self._settle(jobs)  # 4. jobs held for jobs; hopeless cancelled
            self._release_inactive_groups()  # 5. gangs whose job ended in the store
            self._schedule(nodes, jobs, waiting)  # 6. decide, write, act
            busy = self._poll_groups()  # 7. what the gangs report
            self._leadership.after_pass()  # 8. now and then, reap what no job owns
            return busy

    def run(
        self,
        stop: threading.Event,
        interval_s: float,
        *,
        busy_interval_s: float | None = None,
        wake: threading.Event | None = None,
        fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Tick until `stop` is set; one bad pass is logged, never fatal to the loop,
        except a lost Ray node of the service's own (`DriverNodeLost`): the loop steps
        down (a standby may take over at once) and hands it to `fatal`, which ends the
        service so that it is restarted.

        Passes come every `interval_s`, every `busy_interval_s` while a gang is in
        transition (each step of a launch waits for a pass: admit, placement, rendezvous,
        start), and when `wake` is set (the API sets it on submit and cancel) as soon as
        the loop has rested as long as its last pass took: wake-ups during a pass and the
        rest after it make one pass, so a stream of submits gets a pass per two pass
        lengths and the loop holds at most half the CPU (and the GIL) the API serves with."""
        wake = wake or threading.Event()
        self._leadership.start()
        while not stop.is_set():
            busy = False
            started = time.monotonic()
            try:
                if self.lead():
                    busy = self.tick()
            except Fenced as exc:
                self._leadership.fenced(exc)
            except DriverNodeLost as exc:
                log.error("%s; this service stops, to be restarted and reattach", exc)
                if fatal is not None:
                    fatal(exc)
                break
            except Exception:
                log.exception("scheduling pass failed; retrying next interval")
            ended = time.monotonic()
            wake.wait(busy_interval_s if busy and busy_interval_s else interval_s)
            stop.wait(max(0.0, (ended - started) - (time.monotonic() - ended)))
            wake.clear()
        self._leadership.step_down()

    def _settle(
        self, jobs: list[JobRecord]
    ) -> tuple[list[JobRecord], Mapping[int, tuple[Upstream, ...]]]:
        """Dependencies judged after the jobs are loaded: every loaded job was committed
        before the dependency query, so its rows are seen (a job submitted between the
        two would otherwise be scheduled without its condition). Jobs the step cancelled
        leave the list."""
        waiting = self._dependencies.settle()
        if any(job.id not in self._jobs.records for job in jobs):
            jobs = [job for job in jobs if job.id in self._jobs.records]
        return jobs, waiting

    def _release_inactive_groups(self) -> None:
        held = self._jobs.records
        for job_id in self._executor.job_ids():
            job = held.get(job_id)
            if job is None or job.state not in RESOURCE_HOLDING_STATES:
                self._executor.release(job_id)

    def _schedule(
        self, nodes: list[Node], jobs: list[JobRecord], waiting: Mapping[int, tuple[Upstream, ...]]
    ) -> None:
        now = self._clock()
        views = _with_expendable(
            self._predictions.views(jobs, self._jobs, nodes, now), self._sweeps.expendable
        )
        decisions = schedule(
            ClusterSnapshot(tuple(nodes)),
            views,
            now,
            self._policy,
            queues=self._queues(),
            usage=self._recent_usage(now),
            waiting=waiting,
        )
        faults.inject("scheduler.decided")  # a pass stalled between deciding and writing
        notes, versions = self._applier.decisions(self._jobs.records, decisions)
        self._jobs.noted(notes, versions)
        self._predictions.record(decisions, now)

    def _calibrate(self, nodes: Sequence[Node]) -> None:
        """Queue calibration runs for each unmeasured GPU node type (once each, one type's
        runs at a time: the most common type first)."""
        if self._calibration is None:
            return
        types: list[NodeType | None] = [*gpu_node_types(nodes)] or [common_node_type(nodes)]
        for node in types:
            if self._calibration.check(node, self._calibrated):
                return

    def _calibrated(self, node: NodeType) -> bool:
        self._predictions.refresh()  # what succeeded before this process started counts
        return self._predictions.calibration(node) is not None

    def _recent_usage(self, now: datetime) -> dict[tuple[str, str], float]:
        """Decayed GPU-seconds per (queue, user); runs older than 10 half-lives count < 0.1%.
        Derived again when a job started, ended or changed, else every `_USAGE_EVERY_S`
        (what running gangs add meanwhile is negligible against a half-life of days)."""
        kept = self._usage
        if kept and kept[0] == self._jobs.generation and now - kept[1] < _USAGE_EVERY:
            return kept[2]
        since = now - timedelta(seconds=10 * self._half_life_s)
        usage = decayed_usage(self._repo.usage_intervals(since), now, self._half_life_s)
        self._usage = (self._jobs.generation, now, usage)
        return usage

    # -- polling ----------------------------------------------------------------------

    def _poll_groups(self) -> bool:
        """Observe every group; True if one is still on its way (see `tick`)."""
        gangs = self._executor.job_ids()
        self._ingest.keep_only(gangs)
        if len(self._quiet) > len(gangs):  # some gang is gone
            self._quiet = {job_id: q for job_id, q in self._quiet.items() if job_id in gangs}
        # The gangs' jobs as this pass left them (its own transitions are patched in).
        current = self._jobs.records
        busy = False
        progress: list[ProgressNote] = []
        now = self._clock()
        for job_id, status in self._executor.poll().items():
            job = current.get(job_id)
            if job is None or job.state not in RESOURCE_HOLDING_STATES:
                self._executor.release(job_id)
                continue
            busy = busy or job.state in _TRANSITIONAL_STATES
            if self._still_quiet(job, status, now):
                continue
            if note := self._observe(job, status):
                progress.append(note)
        versions, at = self._repo.record_progress_many(progress)  # one transaction
        self._jobs.progressed(progress, versions, at)
        return busy

    def _still_quiet(self, job: JobRecord, status: GroupStatus, now: datetime) -> bool:
        """The same row, the same report with no new lines or points, as when the
        lifecycle last found nothing in it, and none of its clock rules due yet: nothing
        to do."""
        quiet = self._quiet.get(job.id)
        return (
            quiet is not None
            and not status.logs
            and not status.points
            and quiet[0] == job.version
            and quiet[1] == status
            and (quiet[2] is None or now < quiet[2])
        )

    def _observe(self, job: JobRecord, status: GroupStatus) -> ProgressNote | None:
        """Ingest the report, then apply what the lifecycle makes of it until it rests;
        the progress point left for the pass's batch. A report that moves the job has
        its point stored first, on its own: whoever sees the new state (SUCCEEDED) sees
        the step it ended at."""
        note = self._ingest.record(job, status, self._nodes.names)
        for attempt in range(_MAX_TRANSITIONS_PER_REPORT):
            change = next_transition(job, status, self._clock(), self._lifecycle)
            if change is None:
                if attempt == 0 and note is None:
                    until = quiet_until(job, status, self._lifecycle)
                    self._quiet[job.id] = (job.version, status, until)
                break
            if note is not None:
                self._repo.record_progress_many([note])
                note = None
            moved = self._applier.apply(job, change)
            if moved.state is not change.to or change.relaunch:
                break  # someone else moved it, or the next attempt owns the gang now
            job = moved
        return note
