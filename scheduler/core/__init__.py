"""The pure scheduling policy: no Ray, SQL, FastAPI, asyncio, clock or randomness.

`schedule(snapshot, jobs, now, config)` is the whole contract; everything here is
deterministic.
"""

from scheduler.core.config import PolicyConfig
from scheduler.core.decisions import (
    Admit,
    Blocker,
    Decision,
    Explanation,
    Preempt,
    Resize,
    Wait,
)
from scheduler.core.feasibility import missing_types_reason, never_fits_reason
from scheduler.core.ordering import queue_order, victim_order
from scheduler.core.placement import Capacity, free_capacity, place_gang
from scheduler.core.schedule import schedule

__all__ = [
    "Admit",
    "Blocker",
    "Capacity",
    "Decision",
    "Explanation",
    "PolicyConfig",
    "Preempt",
    "Resize",
    "Wait",
    "free_capacity",
    "missing_types_reason",
    "never_fits_reason",
    "place_gang",
    "queue_order",
    "schedule",
    "victim_order",
]
