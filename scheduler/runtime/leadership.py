"""Leadership: hold the lease, act only under its current generation, and on taking over
reconcile the store with Ray.

While it leads, the loop's repository and executor write and act under a `FenceSlot`
holding this leader's fence (`scheduler.store.fencing`): a write or Ray action of a
leader that lost the lease raises `Fenced`, after which the loop drops its gang handles
(the gangs are the new leader's now) and stands by. Taking over (a new generation) is
followed by `reconcile`, which also sweeps Ray for gangs no active (job, attempt) owns,
and so does every `sweep_every`-th pass.
"""

from __future__ import annotations

import logging

from scheduler.model import RESOURCE_HOLDING_STATES, JobState
from scheduler.runtime.applier import Applier
from scheduler.runtime.executor import Executor
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.lifecycle import relaunch
from scheduler.runtime.nodes import NodeWatch
from scheduler.store import Fenced, FenceSlot, JobRepository

log = logging.getLogger(__name__)

# Passes between sweeps of Ray for gangs no active job owns (GANGWAY_SWEEP_EVERY_PASSES).
SWEEP_EVERY_PASSES = 30


class Leadership:
    def __init__(
        self,
        repo: JobRepository,
        executor: Executor,
        applier: Applier,
        lease: LeaderLease | None,
        *,
        nodes: NodeWatch,
        fence: FenceSlot,
        sweep_every: int = SWEEP_EVERY_PASSES,
    ) -> None:
        self._repo = repo
        self._executor = executor
        self._applier = applier
        self._lease = lease
        self._nodes = nodes
        self._fence = fence
        self._sweep_every = sweep_every
        self._passes = 0
        self.leading = False

    def start(self) -> None:
        """Renew the lease from its own heartbeat thread from now on."""
        if self._lease is not None:
            self._lease.start()

    def lead(self) -> bool:
        """True while this loop leads (always without a lease). A loop that has just
        become the leader (a new lease generation) reconciles first."""
        if self._lease is None:
            if not self.leading:
                self.reconcile()
                self.leading = True
            return True
        fence = self._lease.current()
        if fence is None:
            if self.leading:
                log.warning("scheduler lease lost; standing by")
                self.stand_by()
            return False
        if fence != self._fence.current:
            self._executor.forget()  # handles of an older generation are another's now
            self._fence.current = fence
            self.leading = True
            log.info(
                "scheduler lease taken by %s (generation %d); reconciling",
                fence.holder,
                fence.generation,
            )
            self.reconcile()
        return True

    def fenced(self, error: Fenced) -> None:
        """A write or action was refused: another leader took over."""
        log.warning("fenced, standing by: %s", error)
        self.stand_by()

    def stand_by(self) -> None:
        """Stop acting: drop every handle without touching Ray (the gangs are the next
        leader's to reattach) and write nothing until the lease is this loop's again."""
        self._executor.forget()
        self._fence.current = None
        self.leading = False

    def step_down(self) -> None:
        """Stop renewing and give the lease up at once, so a standby need not wait."""
        if self._lease is not None:
            self._lease.stop()
            self.stand_by()

    def reconcile(self) -> None:
        """Match every active job in the store with what Ray runs: reattach the running
        gangs; requeue the rest, reaping by name whatever Ray still runs for them (the
        previous leader's handles are gone with it); then sweep Ray for the rest."""
        self._nodes.restore()
        alive = {node.id for node in self._nodes.refresh() if node.alive}
        for job in self._repo.in_states(RESOURCE_HOLDING_STATES):
            lost = sorted(set(job.placement or ()) - alive)
            if lost:
                self._executor.reap(job)
                self._applier.requeue(
                    job,
                    f"the service restarted (or took over) and found node(s) {', '.join(lost)} "
                    "of its placement not alive in Ray; requeued (not counted as a failure)",
                )
            elif job.state is JobState.RESIZING:
                # The store holds the new placement; the old gang cannot be attached by
                # it, so it goes, and the job resumes from its newest checkpoint.
                self._executor.reap(job)
                self._applier.apply(job, relaunch(job, "the service restarted during the resize"))
            elif job.state in (JobState.RUNNING, JobState.PREEMPTING) and self._executor.attach(
                job
            ):
                log.info("job %s: reattached to its running ranks", job.id)
                if job.state is JobState.PREEMPTING:
                    self._executor.stop(job.id)  # the notice may have died with the old leader
            else:
                self._executor.reap(job)
                self._applier.requeue(
                    job,
                    f"the service restarted and found no live ranks for attempt "
                    f"{job.attempt}; requeued (not counted as a failure)",
                )
        self.sweep()

    def after_pass(self) -> None:
        """Every `sweep_every` passes, sweep (gangs can be orphaned while leading too:
        a launch interrupted by a Ray error, a teardown that did not reach Ray)."""
        self._passes += 1
        if self._passes % self._sweep_every == 0:
            self.sweep()

    def sweep(self) -> None:
        """Tear down every Gangway gang on Ray that no active (job, attempt) owns."""
        active = {(job.id, job.attempt) for job in self._repo.in_states(RESOURCE_HOLDING_STATES)}
        for job_id, attempt in self._executor.sweep(active):
            log.warning(
                "reaped job %s attempt %s: Ray ran it and no active job owns it", job_id, attempt
            )
