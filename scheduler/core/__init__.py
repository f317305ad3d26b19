"""The pure scheduling policy: no Ray, SQL, FastAPI, asyncio, clock or randomness.

`schedule(snapshot, jobs, now)` is the whole contract; everything here is deterministic.
"""

from scheduler.core.decisions import Admit, Decision, Wait
from scheduler.core.feasibility import never_fits_reason
from scheduler.core.placement import Capacity, free_capacity, place_gang
from scheduler.core.schedule import queue_order, schedule

__all__ = [
    "Admit",
    "Capacity",
    "Decision",
    "Wait",
    "free_capacity",
    "never_fits_reason",
    "place_gang",
    "queue_order",
    "schedule",
]
