"""Gang placement: all ranks or none, tensor-parallel groups inside one node, best fit.

Ranks are laid out (pp, dp, tp) with tp innermost, so one tensor-parallel group is `tp`
consecutive ranks. Groups are placed one by one on the node with the fewest free GPUs that
still fits them (best fit), which keeps whole nodes free for large gangs. All groups of a
gang are the same size, so greedy best fit finds a placement whenever one exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.model import GangShape, JobView, Node, Placement


@dataclass(frozen=True)
class Capacity:
    """Free resources on one node."""

    gpus: int
    cpus: float

    def fits(self, gpus: int, cpus: float) -> bool:
        return self.gpus >= gpus and self.cpus >= cpus

    def minus(self, gpus: int, cpus: float) -> Capacity:
        return Capacity(self.gpus - gpus, self.cpus - cpus)


def total_capacity(nodes: Iterable[Node]) -> dict[str, Capacity]:
    return {n.id: Capacity(n.num_gpus, n.num_cpus) for n in nodes if n.alive}


def free_capacity(nodes: Iterable[Node], holders: Iterable[JobView]) -> dict[str, Capacity]:
    """Capacity of alive nodes minus what jobs holding placements use."""
    free = total_capacity(nodes)
    for job in holders:
        if job.placement is None:
            continue
        for node_id in job.placement.node_ids:
            if node_id in free:
                free[node_id] = free[node_id].minus(
                    job.shape.gpus_per_rank, job.shape.cpus_per_rank
                )
    return free


def place_gang(shape: GangShape, free: Mapping[str, Capacity]) -> Placement | None:
    """Place every rank of `shape` or return None; never a partial placement."""
    group_gpus = shape.ranks_per_group * shape.gpus_per_rank
    group_cpus = shape.ranks_per_group * shape.cpus_per_rank
    remaining = dict(free)
    node_ids: list[str] = []
    for _ in range(shape.num_ranks // shape.ranks_per_group):
        node_id = _best_fit(remaining, group_gpus, group_cpus)
        if node_id is None:
            return None
        remaining[node_id] = remaining[node_id].minus(group_gpus, group_cpus)
        node_ids.extend([node_id] * shape.ranks_per_group)
    return Placement(tuple(node_ids))


def _best_fit(free: Mapping[str, Capacity], gpus: int, cpus: float) -> str | None:
    """The fitting node with the fewest free GPUs; ties broken by node id (determinism)."""
    fitting = [(cap.gpus, node_id) for node_id, cap in free.items() if cap.fits(gpus, cpus)]
    return min(fitting)[1] if fitting else None
