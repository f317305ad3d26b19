"""Run time of opaque jobs (scripts, functions, trace jobs) from the cluster's history.

As Helios' QSSF and Lucid do, a job is expected to run about as long as the recent jobs
most like it: the same user and name, else the same user with the same GPU count, else
the same queue with the same GPU count, and so on to the whole queue. The estimate is
the median of the most specific group holding at least `min_samples` finished jobs, with
the group's interquartile range as its uncertainty. With no such group it says
"unknown" (`Prediction.runtime_s is None`) instead of guessing.

For a job already running for `elapsed_s`, the estimate is conditional: the median of
the similar jobs that ran longer than that (a job that has outlived its estimate is not
about to end), or unknown when none did.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """What is known of a job before it runs."""

    queue: str = "default"
    user: str = "default"
    name: str = ""
    num_gpus: int = 1


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted total run time on the job's gang; `runtime_s` None means unknown."""

    runtime_s: float | None
    low_s: float | None = None  # 25th percentile of the group
    high_s: float | None = None  # 75th percentile
    basis: str = "no similar finished job"
    samples: int = 0

    @property
    def known(self) -> bool:
        return self.runtime_s is not None


UNKNOWN = Prediction(None)
_KEYS_KEPT = 4096  # features whose group keys a predictor remembers

# Groups from the most to the least specific; each a tuple of JobFeatures attributes.
GROUPS: tuple[tuple[str, ...], ...] = (
    ("user", "name", "num_gpus"),
    ("user", "name"),
    ("user", "num_gpus"),
    ("queue", "num_gpus"),
    ("user",),
    ("queue",),
)


class RuntimePredictor:
    """Learns online from finished jobs (`observe`), answers `predict`. Each group keeps
    its last `window` run times (recent behaviour wins) sorted for quantiles."""

    def __init__(self, *, window: int = 50, min_samples: int = 3) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be >= 1")
        self.window = window
        self.min_samples = min_samples
        self._recent: dict[tuple[object, ...], deque[float]] = {}
        self._sorted: dict[tuple[object, ...], list[float]] = {}
        self._keys: dict[JobFeatures, tuple[tuple[object, ...], ...]] = {}  # per GROUPS

    def observe(self, features: JobFeatures, runtime_s: float) -> None:
        for key in self._group_keys(features):
            recent = self._recent.setdefault(key, deque())
            ordered = self._sorted.setdefault(key, [])
            if len(recent) == self.window:
                ordered.pop(bisect.bisect_left(ordered, recent.popleft()))
            recent.append(runtime_s)
            bisect.insort(ordered, runtime_s)

    def predict(self, features: JobFeatures, elapsed_s: float = 0.0) -> Prediction:
        """Total run time expected for a job like `features` that has run `elapsed_s`."""
        found = self._lookup(features, elapsed_s)
        if found is None:
            return UNKNOWN
        attributes, ordered, start = found
        if start == len(ordered):
            return Prediction(None, basis=f"ran longer than every job of its {_name(attributes)}")
        low, median, high = _quartiles(ordered, start)
        count = len(ordered) - start
        basis = f"median of {count} finished jobs of the same {_name(attributes)}"
        return Prediction(median, low, high, basis, count)

    def runtime_s(self, features: JobFeatures, elapsed_s: float = 0.0) -> float | None:
        """`predict(features, elapsed_s).runtime_s` without building the rest (the
        simulator asks this for every job on every pass)."""
        found = self._lookup(features, elapsed_s)
        if found is None:
            return None
        _, ordered, start = found
        if start == len(ordered):
            return None
        return ordered[start + (len(ordered) - start - 1) // 2]

    def _lookup(
        self, features: JobFeatures, elapsed_s: float
    ) -> tuple[tuple[str, ...], list[float], int] | None:
        """The most specific group with enough samples: its attributes, its sorted run
        times, and the index of the first one longer than `elapsed_s`."""
        for attributes, key in zip(GROUPS, self._group_keys(features), strict=True):
            ordered = self._sorted.get(key)
            if not ordered or len(ordered) < self.min_samples:
                continue
            return attributes, ordered, bisect.bisect_right(ordered, elapsed_s)
        return None

    def _group_keys(self, features: JobFeatures) -> tuple[tuple[object, ...], ...]:
        keys = self._keys.get(features)
        if keys is None:
            if len(self._keys) >= _KEYS_KEPT:  # a service sees ever new names: stay bounded
                self._keys.clear()
            keys = self._keys[features] = tuple(_key(features, a) for a in GROUPS)
        return keys


def _key(features: JobFeatures, attributes: tuple[str, ...]) -> tuple[object, ...]:
    return (attributes, *(getattr(features, a) for a in attributes))


def _name(attributes: tuple[str, ...]) -> str:
    return ", ".join(a.replace("num_gpus", "GPU count") for a in attributes)


def _quartiles(ordered: Sequence[float], start: int = 0) -> tuple[float, float, float]:
    """Nearest-rank quartiles of the sorted `ordered[start:]` (O(1), no copy: this runs
    per job per pass)."""
    last = len(ordered) - start - 1
    return (
        ordered[start + last // 4],
        ordered[start + last // 2],
        ordered[start + (3 * last + 3) // 4],
    )


@dataclass(frozen=True, slots=True)
class Accuracy:
    """How good the predictions were on finished jobs: median absolute percentage error
    and Spearman rank correlation over the jobs that got one, and how many did."""

    predicted: int
    unknown: int
    median_ape: float | None
    spearman: float | None


def accuracy(pairs: Sequence[tuple[float | None, float]]) -> Accuracy:
    """(predicted or None, actual) per finished job -> `Accuracy`."""
    known = [(p, a) for p, a in pairs if p is not None and a > 0]
    unknown = len(pairs) - len(known)
    if not known:
        return Accuracy(0, unknown, None, None)
    predicted = np.array([p for p, _ in known])
    actual = np.array([a for _, a in known])
    median_ape = float(np.median(np.abs(predicted - actual) / actual))
    return Accuracy(len(known), unknown, median_ape, spearman(predicted, actual))


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rank correlation (Pearson's on average ranks); None when undefined
    (fewer than 3 points, or one side constant)."""
    if len(x) < 3:
        return None
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks: tied values share the mean of the ranks they span."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2.0)[inverse]
