"""The loop's step for jobs that wait for jobs: read the open dependencies, let the pure
core judge them (`core.dependencies.settle`), then write what it found: cancellations
first (one transition and one event each, upstream before dependents), then the rows it
closed. A crash between the two leaves open rows of a cancelled job, which the next pass
closes; the reverse order could let a job run whose condition never held."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

from scheduler.core.dependencies import OpenDependency, Settlement, Upstream, settle
from scheduler.model import Condition, JobState
from scheduler.store import JobEnded, JobRecord, JobRepository, StaleState

log = logging.getLogger(__name__)


class DependencyGate:
    def __init__(self, repo: JobRepository, written: Callable[[JobRecord], None]) -> None:
        self._repo = repo
        self._written = written  # each cancelled job's row, for the working set

    def settle(self) -> Mapping[int, tuple[Upstream, ...]]:
        """Settle every open dependency; the pending jobs still held, with what they wait
        for (the scheduling pass leaves them out of the queue)."""
        found = self._repo.open_dependencies()
        if not found:
            return {}
        settlement = settle(found)
        cancelled = [job_id for job_id, reason in settlement.cancel if self._cancel(job_id, reason)]
        self._repo.close_dependencies(settlement.met, [*settlement.closed, *cancelled])
        self._release(settlement, found)
        return settlement.waiting

    def _release(self, settlement: Settlement, found: list[OpenDependency]) -> None:
        """A job whose last condition held starts its wait in the queue now (it did not
        age while it could not run, as Slurm counts from eligibility), with an event that
        says what let it go."""
        met = set(settlement.met)
        released: dict[int, list[Upstream]] = {}
        for dep in found:
            if (dep.job_id, dep.upstream.job_id) in met and dep.job_id not in settlement.waiting:
                released.setdefault(dep.job_id, []).append(dep.upstream)
        for job_id, upstreams in released.items():
            reason = "dependencies met: " + ", ".join(
                f"job {u.job_id} {_what(u)}" for u in upstreams
            )
            with contextlib.suppress(JobEnded, StaleState):
                self._written(self._repo.annotate(job_id, reason, queued_at=self._repo.now()))

    def _cancel(self, job_id: int, reason: str) -> bool:
        """Cancel a pending job whose condition can no longer hold; a job someone else
        moved meanwhile (a user cancelled it) is left as they left it."""
        try:
            record = self._repo.transition(
                job_id, JobState.CANCELLED, reason=reason, expected=JobState.PENDING
            )
        except StaleState as exc:
            log.info("job %s: %s; not cancelling it for its dependency", job_id, exc)
            return False
        self._written(record)
        return True


def _what(upstream: Upstream) -> str:
    """What the upstream job did that met the condition, in the event's words."""
    return "started" if upstream.condition is Condition.STARTED else upstream.state.value
