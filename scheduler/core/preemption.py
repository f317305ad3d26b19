"""Choose victims for a pending job: whole gangs, only if removing them makes it fit.

Victims are simulated away on a copy of the free capacity; nothing is committed unless the
job then fits (principle 6). Only RUNNING jobs that are preemptible and have run at least
`min_runtime_s` qualify, and only if they rank strictly lower than the job:

- a lower base (un-aged) priority: aging alone never causes a preemption;
- or the same priority and a lower service band (more GPU time attained, least attained
  service first), and no more than `service_preemption_loss_s` of work lost since the
  victim's last checkpoint: making room for short jobs must not throw long ones' work away;
- with `preemption_payoff`, a preemption for service also has to pay for itself
  (`_pays_off`): the victim is predicted to run longer than the newcomer by more than
  the cost of stopping and resuming it;
- or quota reclaim: a job whose queue is still within its guarantee may preempt jobs of
  other queues that run on borrowed GPUs, whatever their priority.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from datetime import datetime

from scheduler.core.config import PolicyConfig
from scheduler.core.ordering import rank, victim_order, work_lost_s
from scheduler.core.placement import Capacity, FreePool, place_gang, usage
from scheduler.model import JobState, JobView


def choose_victims(
    job: JobView,
    free: FreePool,
    pool: Iterable[JobView],
    now: datetime,
    config: PolicyConfig,
    *,
    borrowed: Set[int] = frozenset(),
    reclaim: bool = False,
    ranks: Mapping[int, tuple[int, float]] | None = None,
) -> list[JobView] | None:
    """The cheapest set of gangs whose removal lets `job` fit, pruned so that no victim
    could be spared; None when no such set exists. `pool`: the pass's candidates
    (`victim_pool`: past `could_be_victim`, in `victim_order` under the same `borrowed`),
    so the walk stops at the first set that makes room, or at the first gang that is not
    borrowed and ranks no lower than the job, instead of sorting every holder for every
    blocked job. `reclaim`: the job's queue is within its guarantee, so `borrowed` jobs of
    other queues are fair game. `ranks`: holder id -> `rank` at `now`, where known."""
    reclaimable = borrowed if reclaim else frozenset()
    ranks = ranks if ranks is not None else {}
    job_rank = rank(job, now, config)
    chosen: list[JobView] = []
    capacity: FreePool | None = None  # free plus the chosen: copied at the first victim
    for victim in pool:
        if victim.id not in borrowed and _rank_of(victim, now, config, ranks) >= job_rank:
            return None  # the rest rank no lower, and no borrowed gang comes after
        if not _eligible(
            victim, job, job_rank, now=now, config=config, reclaimable=reclaimable, ranks=ranks
        ):
            continue
        chosen.append(victim)
        if capacity is None:
            capacity = free.copy()
        capacity.give_all(_held(victim))
        if place_gang(job.shape, capacity) is not None:
            break
    else:
        return None
    for victim in reversed(list(chosen)):  # spare the most expensive first
        rest = [v for v in chosen if v is not victim]
        # a fresh pool per try: taking a victim out of `capacity` and giving it back
        # would not restore float CPU sums bit for bit, and a try could then see room
        # the real freed pool does not have
        if place_gang(job.shape, freed_by(free, rest)) is not None:
            chosen = rest
    return chosen


class VictimPool:
    """A pass's preemption candidates in `victim_order`, drawn from its generator only as
    far as a search walks (most stop in the first group of one rank, so the other groups
    are never sorted), less the gangs dropped from it (preempted or resized in the pass)."""

    def __init__(self, order: Iterator[JobView]) -> None:
        self._order = order
        self._drawn: list[JobView] = []
        self._dropped: set[int] = set()

    def __iter__(self) -> Iterator[JobView]:
        index = 0
        while True:
            if index == len(self._drawn):
                following = next(self._order, None)
                if following is None:
                    return
                self._drawn.append(following)
            gang = self._drawn[index]
            index += 1
            if gang.id not in self._dropped:
                yield gang

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None

    def drop(self, ids: Set[int]) -> None:
        self._dropped |= ids


def victim_pool(
    holders: Sequence[JobView],
    now: datetime,
    config: PolicyConfig,
    borrowed: Set[int],
    *,
    node_gpus: int = 0,
) -> tuple[VictimPool, dict[int, tuple[int, float]]]:
    """The holders that could be preempted at all (`could_be_victim`), cheapest first
    (`victim_order`: the order does not depend on the job to make room for), and their
    ranks by job id. `node_gpus`: the cluster's largest node (`gang_size`)."""
    candidates = [h for h in holders if could_be_victim(h, now, config)]
    ranks = {h.id: rank(h, now, config) for h in candidates}
    order = victim_order(candidates, now, config, borrowed, ranks, node_gpus=node_gpus)
    return VictimPool(order), ranks


def freed_by(free: FreePool, jobs: Sequence[JobView]) -> FreePool:
    """A copy of `free` plus everything `jobs` hold."""
    capacity = free.copy()
    for job in jobs:
        capacity.give_all(_held(job))
    return capacity


def _held(job: JobView) -> dict[str, Capacity]:
    return usage(job.shape, job.placement) if job.placement is not None else {}


def could_be_victim(victim: JobView, now: datetime, config: PolicyConfig) -> bool:
    """The part of eligibility that does not depend on the job to make room for:
    running, preemptible, and past `min_runtime_s`."""
    if victim.state is not JobState.RUNNING or not victim.preemptible or victim.run is None:
        return False
    return (now - victim.run.started_at).total_seconds() >= config.min_runtime_s


def _eligible(
    victim: JobView,
    job: JobView,
    job_rank: tuple[int, float],
    *,
    now: datetime,
    config: PolicyConfig,
    reclaimable: Set[int],
    ranks: Mapping[int, tuple[int, float]],
) -> bool:
    reclaiming = victim.id in reclaimable and victim.queue != job.queue
    if reclaiming or victim.priority < job.priority:
        return True
    if victim.priority != job.priority:
        return False
    return (
        _rank_of(victim, now, config, ranks) < job_rank
        and work_lost_s(victim, now) <= config.service_preemption_loss_s
        and (not config.preemption_payoff or _pays_off(victim, job, now, config))
    )


def _rank_of(
    victim: JobView, now: datetime, config: PolicyConfig, ranks: Mapping[int, tuple[int, float]]
) -> tuple[int, float]:
    known = ranks.get(victim.id)
    return known if known is not None else rank(victim, now, config)


def _pays_off(victim: JobView, job: JobView, now: datetime, config: PolicyConfig) -> bool:
    """Preempting `victim` for `job` pays when the victim would hold its GPUs longer than
    the newcomer needs them plus what the swap costs (stop, warm-up, lost work): running
    the shorter job first then shortens the pair's total completion time. A victim of
    unknown length counts as long (so with no predictions at all, service order alone
    decides); a newcomer of unknown length is not known to be short."""
    victim_left = victim.predicted_remaining_s
    if victim_left is None:
        return True
    job_left = job.predicted_remaining_s
    if job_left is None:
        return False
    cost = config.checkpoint_grace_s + config.restart_cost_s + work_lost_s(victim, now)
    return victim_left > job_left + cost
