"""How fast one GPU type trains relative to another: a seed table, and the cluster's own
measurements once it has them.

A gang's run time on a type is its run time on the reference type (H100) divided by the
type's speed. The seed is a rough public ratio of training throughput per GPU (dense
16-bit tensor work, as MLPerf Training results and the vendors' peak figures place the
generations); it only orders types and sizes the gain until this cluster measured its
own: a type calibrated by `gangway calibrate` gets its speed from the fitted step-time
model instead (`measured_speeds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

REFERENCE_TYPE = "H100"
SEED_SPEEDS: Mapping[str, float] = {
    "B200": 2.2,
    "H200": 1.15,
    "GH200": 1.15,
    "H100": 1.0,
    "H800": 1.0,
    "A100": 0.4,
    "A800": 0.4,
    "L40S": 0.35,
    "L40": 0.3,
    "A40": 0.3,
    "A6000": 0.3,
    "A10G": 0.12,
    "A10": 0.12,
    "L4": 0.12,
    "V100": 0.15,
    "T4": 0.06,
    "P100": 0.05,
}
# A type neither seeded nor measured: taken as fast as the reference (a guess, placed
# after seeded types of the same speed) until `gangway calibrate` measures it.
UNKNOWN_SPEED = 1.0


def seed_speed(gpu_type: str | None) -> float:
    """The seed table's speed for a type name as Ray or a label spells it ("NVIDIA H100
    80GB HBM3", "H100", "A100-SXM4-80GB"): the longest seeded name it contains."""
    if not gpu_type:
        return UNKNOWN_SPEED
    name = gpu_type.upper()
    matches = [seeded for seeded in SEED_SPEEDS if seeded in name]
    return SEED_SPEEDS[max(matches, key=len)] if matches else UNKNOWN_SPEED


def measured_speeds(step_times: Mapping[str, float]) -> dict[str, float]:
    """Speeds from one reference workload's step time per type (the calibrated step-time
    model's prediction for the same model and plan on each type): relative to the
    reference type where it was measured, else to the seed speed of the fastest seeded
    type measured, so measured and seeded speeds stay on one scale."""
    timed = {t: s for t, s in step_times.items() if s > 0}
    if not timed:
        return {}
    if REFERENCE_TYPE in timed:
        anchor, anchor_speed = REFERENCE_TYPE, 1.0
    else:
        anchor = max(sorted(timed), key=seed_speed)  # ties: by name, never by dict order
        anchor_speed = seed_speed(anchor)
    return {t: anchor_speed * timed[anchor] / s for t, s in timed.items()}


def speeds_for(types: Iterable[str], measured: Mapping[str, float]) -> dict[str, float]:
    """Each type's speed: measured where this cluster measured it, else seeded ("", a
    type not known, gets UNKNOWN_SPEED)."""
    return {t: measured.get(t, seed_speed(t)) for t in types}
