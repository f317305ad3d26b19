"""The built-in trainer's numerical health: which steps are bad, and the policy for them.

A step is bad when its loss is NaN or infinite, or spikes: above `spike_factor` x the
median of the last `spike_window` good losses, once min(10, spike_window) good losses
are in the window (fewer say nothing about a typical loss yet). The trainer judges the
step's global loss, which every rank gets bit for bit from the same all-reduce, and a
rank whose gradient norm is not finite puts NaN into that all-reduce: so one rank's bad
gradients reach every rank, and all decide alike with no collective of their own
(`workers.engine.training`). What happens to a bad step: `gangway.models.Instability`.

Pure Python, so the rule is tested on its own.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Literal

from gangway.models import Instability, wire_default

# Good losses the window holds at least before a spike can be called.
MIN_GOOD_LOSSES = 10


@dataclass(frozen=True)
class InstabilityPolicy:
    """`gangway.models.Instability` as the ranks get it (defaults from there)."""

    action: Literal["fail", "skip", "rollback"] = wire_default(Instability, "action")
    spike_factor: float | None = wire_default(Instability, "spike_factor")
    spike_window: int = wire_default(Instability, "spike_window")
    max_rollbacks: int = wire_default(Instability, "max_rollbacks")
    lr_scale: float = wire_default(Instability, "lr_scale")


class InstabilityError(RuntimeError):
    """A bad step the policy gives up on: it ends the rank, and the job, with this text."""


@dataclass(frozen=True)
class BadStep:
    step: int
    loss: float
    grad_norm: float  # this rank's
    reason: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.reason} (grad norm {self.grad_norm:.4g})"


class LossWatch:
    """Judges each step's loss against the recent good ones."""

    def __init__(self, *, spike_factor: float | None, spike_window: int) -> None:
        self.spike_factor = spike_factor
        self.good: deque[float] = deque(maxlen=spike_window)
        self.min_good = min(MIN_GOOD_LOSSES, spike_window)

    def check(self, step: int, loss: float, grad_norm: float) -> BadStep | None:
        """None for a good step (its loss joins the window), else what is wrong."""
        if not math.isfinite(loss):
            return BadStep(step, loss, grad_norm, f"loss is {loss}")
        if self.spike_factor is not None and len(self.good) >= self.min_good:
            median = statistics.median(self.good)
            if loss > self.spike_factor * median:
                reason = f"loss {loss:.4g} spiked over {self.spike_factor:g} x median {median:.4g}"
                return BadStep(step, loss, grad_norm, reason)
        self.good.append(loss)
        return None

    def clear(self) -> None:
        """Forget the window (after a rollback: the losses were of undone steps)."""
        self.good.clear()
