"""Stragglers: ranks persistently slower than their peers.

In a synchronous gang every rank's step takes as long as the slowest one's, so step times
cannot tell who is slow. Ranks report `local_s`, the time of work that waits on no peer
(the built-in trainer: its forward passes); a rank whose median over the last `window`
steps seen is more than `factor` times the median of all ranks' medians is a straggler.
Medians, so one slow step (a garbage collection, a checkpoint) flags nobody.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    local_s: float  # its median local time per step over the window
    ratio: float  # that over the gang's median


# A rank this many times slower than its gang's median, over this many polls with
# progress, is flagged (GANGWAY_STRAGGLER_FACTOR / _WINDOW start from these).
DEFAULT_FACTOR = 1.5
DEFAULT_WINDOW = 10


class StragglerWatch:
    """Samples per (job, attempt); a new attempt (other ranks, other nodes) starts over."""

    def __init__(self, *, factor: float = DEFAULT_FACTOR, window: int = DEFAULT_WINDOW) -> None:
        self.factor, self.window = factor, window
        self._samples: dict[tuple[int, int], deque[tuple[float, ...]]] = {}

    def observe(
        self, job_id: int, attempt: int, local_s: Sequence[float | None]
    ) -> tuple[Straggler, ...] | None:
        """Add one step's per-rank times; the stragglers once `window` steps are in
        (None before, or when some rank does not report the time)."""
        if len(local_s) < 2 or any(value is None for value in local_s):
            return None
        samples = self._samples.setdefault((job_id, attempt), deque(maxlen=self.window))
        samples.append(tuple(float(value or 0.0) for value in local_s))
        if len(samples) < self.window:
            return None
        medians = [statistics.median(column) for column in zip(*samples, strict=True)]
        typical = statistics.median(medians)
        if typical <= 0:
            return ()
        return tuple(
            Straggler(rank, value, value / typical)
            for rank, value in enumerate(medians)
            if value > self.factor * typical
        )

    def keep_only(self, job_ids: set[int]) -> None:
        """Forget jobs no longer running here."""
        for key in [key for key in self._samples if key[0] not in job_ids]:
            del self._samples[key]
