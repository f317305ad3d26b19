"""Named policies for the simulator, all built from the core's own knobs (no second copy of
any policy). A policy may also set the priority the core sees for each job."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.core import PolicyConfig

NEVER_S = 1e15  # an aging interval no wait reaches: aging off

# Tiresias 2D-LAS queue thresholds in attained GPU-seconds (GPUs x time run so far):
# below 1 GPU-hour the top queue, below 10 GPU-hours the middle one, else the bottom.
LAS_THRESHOLDS_GPU_S = (3600.0, 36_000.0)


def las_priority(attained_gpu_s: float) -> int:
    """Higher for less attained service: a job drops a queue as it consumes GPU time."""
    return len(LAS_THRESHOLDS_GPU_S) - sum(attained_gpu_s >= t for t in LAS_THRESHOLDS_GPU_S)


@dataclass(frozen=True)
class SimPolicy:
    name: str
    description: str
    config: PolicyConfig
    priority: Callable[[float], int] | None = None  # attained GPU-seconds -> priority
    fair_share: bool = False  # order users by decayed recent usage


POLICIES: dict[str, SimPolicy] = {
    p.name: p
    for p in (
        SimPolicy(
            "fifo",
            "strict FIFO with gangs: submit order, the head blocks everything behind it",
            PolicyConfig(
                backfill=False, preemption=False, elastic_resize=False, aging_interval_s=NEVER_S
            ),
        ),
        SimPolicy(
            "fifo-backfill",
            "FIFO with greedy backfill: any later job that fits starts, no reservation",
            PolicyConfig(
                reservations=False,
                preemption=False,
                elastic_resize=False,
                aging_interval_s=NEVER_S,
            ),
        ),
        SimPolicy(
            "slurm-easy",
            "Slurm-like priority + EASY backfill on time limits, no preemption, no aging",
            PolicyConfig(preemption=False, elastic_resize=False, aging_interval_s=NEVER_S),
        ),
        SimPolicy(
            "tiresias",
            "Tiresias-style 2D-LAS: priority by attained GPU-time in 3 discretised queues, "
            "preemption, greedy backfill",
            PolicyConfig(
                reservations=False,
                elastic_resize=False,
                aging_interval_s=NEVER_S,
                min_runtime_s=0.0,
            ),
            priority=las_priority,
        ),
        SimPolicy(
            "gangway",
            "Gangway's default: priority + aging, fair share, EASY backfill behind one "
            "reservation, preemption for higher priority",
            PolicyConfig(elastic_resize=False),
            fair_share=True,
        ),
    )
}
