"""Leadership: hold the lease, and on taking over, reconcile the store with Ray."""

from __future__ import annotations

import logging

from scheduler.model import RESOURCE_HOLDING_STATES, JobState
from scheduler.runtime.applier import Applier
from scheduler.runtime.executor import Executor
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.lifecycle import relaunch
from scheduler.store import JobRepository

log = logging.getLogger(__name__)


class Leadership:
    def __init__(
        self,
        repo: JobRepository,
        executor: Executor,
        applier: Applier,
        lease: LeaderLease | None,
    ) -> None:
        self._repo = repo
        self._executor = executor
        self._applier = applier
        self._lease = lease
        self.leading = False

    def lead(self) -> bool:
        """Hold the leader lease (always true without one). A loop that has just become
        the leader reconciles first: the gangs the previous leader ran are reattached."""
        if self._lease is None:
            if not self.leading:
                self.reconcile()
                self.leading = True
            return True
        held = self._lease.hold()
        if held and not self.leading:
            log.info("scheduler lease taken by %s; reconciling", self._lease.holder)
            self.reconcile()
        elif self.leading and not held:
            log.warning("scheduler lease lost; standing by")
        self.leading = held
        return held

    def step_down(self) -> None:
        """Give the lease up at once so a standby need not wait out the TTL."""
        if self._lease is not None and self.leading:
            self._lease.release()
            self.leading = False

    def reconcile(self) -> None:
        """Match every active job in the store with what Ray runs: reattach or requeue."""
        for job in self._repo.in_states(RESOURCE_HOLDING_STATES):
            if job.state is JobState.RESIZING:
                # The store holds the new placement; the old gang cannot be attached by
                # it, so it goes, and the job resumes from its newest checkpoint.
                self._executor.reap(job)
                self._applier.apply(job, relaunch(job, "the service restarted during the resize"))
                continue
            running = job.state in (JobState.RUNNING, JobState.PREEMPTING)
            if running and self._executor.attach(job):
                log.info("job %s: reattached to its running ranks", job.id)
                continue
            self._applier.requeue(
                job,
                f"the service restarted and found no live ranks for attempt {job.attempt}; "
                "requeued (not counted as a failure)",
            )
