"""Decisions are data with a reason (principle 2); the runtime's executor applies them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from scheduler.model import Placement


class Blocker(enum.StrEnum):
    """Which constraint keeps a pending job from starting now."""

    CLUSTER_FULL = "cluster_full"  # fewer free GPUs than the gang needs
    NODE_SHAPE = "node_shape"  # enough GPUs in total, not in the per-node shape it needs
    GPU_TYPE = "gpu_type"  # enough GPUs free, not enough of a type it may run on
    RESERVATION = "reservation"  # would delay the start reserved for a job ahead of it
    PREEMPTING = "preempting"  # lower-priority jobs are checkpointing to make room for it
    QUOTA = "quota"  # its queue would exceed its GPU limit
    DEPENDENCY = "dependency"  # it waits for another job (`depends_on`)
    HOLD = "hold"  # held until released (a sweep's paused trial, until promoted)


@dataclass(frozen=True, slots=True)
class Explanation:
    blocker: Blocker
    message: str  # what failed, in numbers
    unblock: str  # what would let it start
    blocking_job_id: int | None = None


@dataclass(frozen=True, slots=True)
class Admit:
    """Start job `job_id` on `placement` now."""

    job_id: int
    placement: Placement
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop `job_id` (a whole gang) for `for_job_id`: checkpoint and exit by `deadline`."""

    job_id: int
    for_job_id: int
    deadline: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Job `job_id` stays pending. `estimated_start_at` is None when it cannot be told
    (beyond the ETA horizon, or the cluster's alive nodes can never hold it)."""

    job_id: int
    explanation: Explanation
    estimated_start_at: datetime | None = None
    reserved: bool = False  # backfill may not delay this job's estimated start
    # A protected job's wait over its predicted run time (`ordering.protection_ratio`;
    # 0.0: nothing predicts it); None: not protected. Said first in its reason.
    protected: float | None = None

    def estimated(self, at: datetime | None) -> Wait:
        """This wait with `estimated_start_at` set to `at`. Written out rather than
        `dataclasses.replace`, which costs ten times as much: a pass estimates every
        blocked job of a long queue (tests check that every other field is kept)."""
        return Wait(self.job_id, self.explanation, at, self.reserved, self.protected)

    @property
    def reason(self) -> str:
        why = f"{self.explanation.message}; {self.explanation.unblock}"
        return why if self.protected is None else f"{protection_note(self.protected)}; {why}"


def protection_note(ratio: float) -> str:
    """Why a job is protected, from its `ordering.protection_ratio`."""
    if ratio:
        return f"protected: waited {ratio:.1f}x its predicted run time"
    return "protected: queued past starvation_s, no predicted run time"


@dataclass(frozen=True, slots=True)
class Resize:
    """Run elastic job `job_id` with the data-parallel degree of `placement` from now on
    (its tensor- and pipeline-parallel groups unchanged; surviving replicas stay put)."""

    job_id: int
    placement: Placement
    dp: int
    reason: str


Decision = Admit | Preempt | Resize | Wait
