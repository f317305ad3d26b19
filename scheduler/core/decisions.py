"""Decisions are data with a reason (principle 2); the runtime's executor applies them."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.model import Placement


@dataclass(frozen=True)
class Admit:
    """Start job `job_id` on `placement` now."""

    job_id: int
    placement: Placement
    reason: str


@dataclass(frozen=True)
class Wait:
    """Job `job_id` stays pending; `reason` says why in words a user understands."""

    job_id: int
    reason: str


Decision = Admit | Wait
