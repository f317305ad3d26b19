"""Named policies for the simulator, all built from the core's own knobs (no second copy of
any policy): each is a `PolicyConfig` of the core."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler.core import PolicyConfig

NEVER_S = 1e15  # an aging interval no wait reaches: aging off
# The baselines are the published algorithms, pinned whatever the core's defaults are:
# they neither order by predicted remaining service nor ask a preemption to pay for itself,
# and neither gang size orders the queue nor the victims.
BASELINE: dict[str, Any] = {
    "shortest_predicted_first": False,
    "preemption_payoff": False,
    "larger_gangs_first": False,
    "smaller_victims_first": False,
}
# SRSF's preemption counts the work a victim would lose (its progress since its last
# checkpoint), as SRPT with switching costs does: a running job is preempted only when its
# predicted remaining run time exceeds the newcomer's by more than that loss plus the stop
# and restart (`preemption_payoff`), and only while it would lose at most
# `service_preemption_loss_s` (300 s): a job whose remaining time is unknown (it outlived
# every similar finished job) counts as long, so the window alone protects its work.
# Without this, jobs that overran their predictions were preempted before their first
# checkpoint, lost everything, ranked short again and preempted the next one: a livelock.
SRSF_PREEMPTION: dict[str, Any] = {
    **BASELINE,
    "preemption_payoff": True,
    "reservations": False,
    "elastic_resize": False,
    "aging_interval_s": NEVER_S,
    "min_runtime_s": 0.0,
    "starvation_s": NEVER_S,
}


@dataclass(frozen=True)
class SimPolicy:
    name: str
    description: str
    config: PolicyConfig
    fair_share: bool = False  # order users by decayed recent usage


POLICIES: dict[str, SimPolicy] = {
    p.name: p
    for p in (
        SimPolicy(
            "fifo",
            "strict FIFO with gangs: submit order, the head blocks everything behind it",
            PolicyConfig(
                **BASELINE,
                reservations=True,
                backfill=False,
                preemption=False,
                elastic_resize=False,
                aging_interval_s=NEVER_S,
                starvation_s=NEVER_S,  # no protection: the order stays submit order
                service_levels_gpu_s=(),
            ),
        ),
        SimPolicy(
            "fifo-backfill",
            "FIFO with greedy backfill: any later job that fits starts, no reservation",
            PolicyConfig(
                **BASELINE,
                reservations=False,
                preemption=False,
                elastic_resize=False,
                aging_interval_s=NEVER_S,
                starvation_s=NEVER_S,  # no protection: the order stays submit order
                service_levels_gpu_s=(),
            ),
        ),
        SimPolicy(
            "slurm-easy",
            "Slurm-like priority + EASY backfill on time limits, no preemption, no aging",
            PolicyConfig(
                **BASELINE,
                reservations=True,
                preemption=False,
                elastic_resize=False,
                aging_interval_s=NEVER_S,
                starvation_s=NEVER_S,  # no protection: the order stays submit order
                service_levels_gpu_s=(),
            ),
        ),
        SimPolicy(
            "tiresias",
            "Tiresias-style 2D-LAS: priority by attained GPU-time in 3 discretised queues, "
            "preemption, greedy backfill",
            PolicyConfig(
                **BASELINE,
                reservations=False,
                elastic_resize=False,
                aging_interval_s=NEVER_S,
                min_runtime_s=0.0,
                starvation_s=NEVER_S,
                service_preemption_loss_s=NEVER_S,
            ),
        ),
        SimPolicy(
            "gittins",
            "Tiresias-style 2D-Gittins: the 2D-LAS bands, and within a band the higher "
            "Gittins index of attained GPU-time under a prior learned from finished jobs",
            PolicyConfig(
                **BASELINE,
                reservations=False,
                elastic_resize=False,
                aging_interval_s=NEVER_S,
                min_runtime_s=0.0,
                starvation_s=NEVER_S,
                service_preemption_loss_s=NEVER_S,
                service_order="gittins",
            ),
        ),
        SimPolicy(
            "srsf",
            "shortest remaining GPU service first, preemptive, greedy backfill, on "
            "predicted remaining run times (with --oracle: the true ones, a lower bound); "
            "a preemption must pay for the victim's work since its checkpoint",
            PolicyConfig(**SRSF_PREEMPTION, service_order="srsf"),
        ),
        SimPolicy(
            "gangway",
            "Gangway's default: priority with aging across priority classes, least "
            "attained service within one (preempting only near a checkpoint and after "
            "10 minutes of run), protection after 7 days and 8 predicted run times, fair "
            "share, greedy backfill",
            PolicyConfig(elastic_resize=False),
            fair_share=True,
        ),
        SimPolicy(
            "gangway-no-aging",
            "Gangway's default without aging: a job never ranks with a higher priority "
            "class by waiting (the same as the default on a trace of one class)",
            PolicyConfig(elastic_resize=False, aging_interval_s=NEVER_S),
            fair_share=True,
        ),
    )
}
