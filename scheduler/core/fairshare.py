"""Recent usage per (queue, user): GPU-seconds with exponential decay.

A GPU-second used `age` seconds ago counts 2 ** (-age / half_life_s). Integrated over a run
from `start` to `end` with `gpus` GPUs:

    gpus * half_life_s / ln 2 * (2 ** (-(now - end) / h) - 2 ** (-(now - start) / h))
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

# How long a GPU-second counts fully before it counts half: the service's default
# (`GANGWAY_FAIR_SHARE_HALF_LIFE_S`), the scheduler loop's and the simulator's.
HALF_LIFE_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class UsageInterval:
    queue: str
    user: str
    gpus: int
    start: datetime
    end: datetime | None  # None: still running


def decayed_usage(
    intervals: Iterable[UsageInterval], now: datetime, half_life_s: float
) -> dict[tuple[str, str], float]:
    usage: dict[tuple[str, str], float] = {}
    scale = half_life_s / math.log(2)
    for run in intervals:
        end = min(run.end or now, now)
        if end <= run.start:
            continue
        age_end = (now - end).total_seconds()
        age_start = (now - run.start).total_seconds()
        weight = 2 ** (-age_end / half_life_s) - 2 ** (-age_start / half_life_s)
        key = (run.queue, run.user)
        usage[key] = usage.get(key, 0.0) + run.gpus * scale * weight
    return usage
