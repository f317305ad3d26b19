"""Gang placement: all ranks or none, tensor-parallel groups inside one node, best fit.

Ranks are laid out (pp, dp, tp) with tp innermost, so one tensor-parallel group is `tp`
consecutive ranks. Groups are placed one by one on the node with the fewest free GPUs that
still fits them (best fit), which keeps whole nodes free for large gangs. All groups of a
gang are the same size, so greedy best fit finds a placement whenever one exists.

Free capacity is a plain `dict[node_id, Capacity]`; the helpers here return new dicts and
never change their arguments, so callers can simulate on copies (principle 6).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.model import GangShape, JobView, Node, Placement

FreeMap = Mapping[str, "Capacity"]


@dataclass(frozen=True)
class Capacity:
    """Free (or used) resources on one node."""

    gpus: int
    cpus: float

    def fits(self, gpus: int, cpus: float) -> bool:
        return self.gpus >= gpus and self.cpus >= cpus

    def minus(self, gpus: int, cpus: float) -> Capacity:
        return Capacity(self.gpus - gpus, self.cpus - cpus)

    def plus(self, other: Capacity) -> Capacity:
        return Capacity(self.gpus + other.gpus, self.cpus + other.cpus)


def total_capacity(nodes: Iterable[Node]) -> dict[str, Capacity]:
    return {n.id: Capacity(n.num_gpus, n.num_cpus) for n in nodes if n.alive}


def usage(shape: GangShape, placement: Placement) -> dict[str, Capacity]:
    """What a placed gang uses on each node."""
    used: dict[str, Capacity] = {}
    for node_id in placement.node_ids:
        used[node_id] = used.get(node_id, Capacity(0, 0.0)).plus(
            Capacity(shape.gpus_per_rank, shape.cpus_per_rank)
        )
    return used


def with_added(free: FreeMap, used: Mapping[str, Capacity]) -> dict[str, Capacity]:
    """`free` plus resources given back; nodes not in `free` (dead) stay out."""
    result = dict(free)
    for node_id, cap in used.items():
        if node_id in result:
            result[node_id] = result[node_id].plus(cap)
    return result


def with_removed(free: FreeMap, used: Mapping[str, Capacity]) -> dict[str, Capacity]:
    result = dict(free)
    for node_id, cap in used.items():
        if node_id in result:
            result[node_id] = result[node_id].minus(cap.gpus, cap.cpus)
    return result


def without_reserved(free: FreeMap, reserved: Mapping[str, Capacity]) -> dict[str, Capacity]:
    """`free` minus what is set aside for a reserved job, never below zero."""
    result = dict(free)
    for node_id, cap in reserved.items():
        if node_id in result:
            left = result[node_id]
            result[node_id] = Capacity(max(0, left.gpus - cap.gpus), max(0.0, left.cpus - cap.cpus))
    return result


def free_capacity(nodes: Iterable[Node], holders: Iterable[JobView]) -> dict[str, Capacity]:
    """Capacity of alive nodes minus what jobs holding placements use."""
    free = total_capacity(nodes)
    for job in holders:
        if job.placement is not None:
            free = with_removed(free, usage(job.shape, job.placement))
    return free


def free_gpus(free: FreeMap) -> int:
    return sum(cap.gpus for cap in free.values())


def place_gang(shape: GangShape, free: FreeMap) -> Placement | None:
    """Place every rank of `shape` or return None; never a partial placement."""
    group_gpus = shape.ranks_per_group * shape.gpus_per_rank
    group_cpus = shape.ranks_per_group * shape.cpus_per_rank
    groups = shape.num_ranks // shape.ranks_per_group
    # Cheap rejections first: most passes test many jobs against a nearly full cluster.
    if free_gpus(free) < shape.num_gpus:
        return None
    candidates = {n: c for n, c in free.items() if c.fits(group_gpus, group_cpus)}
    if sum(c.gpus // group_gpus if group_gpus else groups for c in candidates.values()) < groups:
        return None
    node_ids: list[str] = []
    for _ in range(groups):
        node_id = _best_fit(candidates, group_gpus, group_cpus)
        if node_id is None:
            return None
        left = candidates[node_id].minus(group_gpus, group_cpus)
        if left.fits(group_gpus, group_cpus):
            candidates[node_id] = left
        else:
            del candidates[node_id]
        node_ids.extend([node_id] * shape.ranks_per_group)
    return Placement(tuple(node_ids))


def _best_fit(free: FreeMap, gpus: int, cpus: float) -> str | None:
    """The fitting node with the fewest free GPUs; ties broken by node id (determinism)."""
    fitting = [(cap.gpus, node_id) for node_id, cap in free.items() if cap.fits(gpus, cpus)]
    return min(fitting)[1] if fitting else None
