"""Job states: part of the wire contract, shared by the SDK and the server.

Standard library only, so the scheduler core can use the very same enum without
depending on pydantic or the SDK's HTTP code. The legal transitions live with the
scheduler (`scheduler.model.TRANSITIONS`).
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    ADMITTED = "ADMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    PREEMPTING = "PREEMPTING"
    RESIZING = "RESIZING"  # an elastic job checkpoints, to restart at another dp
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Condition(enum.StrEnum):
    """When a job that waits for another may start (Slurm's afterok, afterany, afternotok,
    after): the upstream job succeeded; ended in any way; ended without succeeding
    (FAILED or CANCELLED); or has started running (or ended after running)."""

    SUCCEEDED = "succeeded"
    ENDED = "ended"
    FAILED = "failed"
    STARTED = "started"
