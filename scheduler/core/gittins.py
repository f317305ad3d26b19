"""Gittins index of a job's attained service under a service-time distribution learned
from finished jobs (Tiresias' 2D-Gittins, with the prior learned online).

For a job that has attained `a` GPU-seconds, with S its total service drawn from the
prior, the index is max over quanta d of P(S <= a + d | S > a) / E[min(S, a + d) - a | S > a]:
the best rate at which serving it could complete it. Higher ranks first. The index is
tabulated once per prior on a grid of attained levels, so a pass only looks it up.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

GRID_POINTS = 96  # attained levels tabulated, log-spaced between 1 s and the largest sample


class GittinsTable:
    def __init__(self, service_gpu_s: Sequence[float]) -> None:
        samples = np.sort(np.asarray([s for s in service_gpu_s if s > 0], dtype=float))
        if samples.size == 0:
            raise ValueError("the prior needs at least one positive service time")
        top = float(samples[-1])
        self.levels = [0.0, *np.geomspace(1.0, max(top, 1.0), GRID_POINTS).tolist()]
        self.indices = [_index(samples, level) for level in self.levels]

    def index(self, attained_gpu_s: float) -> float:
        """The index at the largest tabulated level not above `attained_gpu_s`."""
        slot = bisect.bisect_right(self.levels, attained_gpu_s) - 1
        return self.indices[max(0, slot)]


def _index(samples: np.ndarray, attained: float) -> float:
    survivors = samples[samples > attained] - attained
    m = survivors.size
    if m == 0:
        return 0.0  # outlived every job seen: no evidence it is about to end
    k = np.arange(1, m + 1)
    spent = np.cumsum(survivors) + (m - k) * survivors  # m x E[min(S - a, d_k)]
    return float(np.max(k / spent))
