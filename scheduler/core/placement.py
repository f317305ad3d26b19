"""Gang placement: all ranks or none, tensor-parallel groups inside one node, best fit.

Ranks are laid out (pp, dp, tp) with tp innermost, so one tensor-parallel group is `tp`
consecutive ranks. Groups are placed one by one on the node with the fewest free GPUs that
still fits them (best fit; ties in a deterministic node order), which keeps whole nodes
free for large gangs. All groups of a gang are the same size, so greedy best fit finds a
placement whenever one exists.

Free capacity is a plain `dict[node_id, Capacity]` for simulations (the helpers return new
dicts and never change their arguments: principle 6), or a `FreePool`, the indexed form
one scheduling pass keeps and updates as it admits.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from scheduler.model import GangShape, JobView, Node, Placement

FreeMap = Mapping[str, "Capacity"]


class Capacity(NamedTuple):
    """Free (or used) resources on one node (a tuple: millions are made per pass)."""

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
        if job.placement is None:
            continue
        rank = Capacity(job.shape.gpus_per_rank, job.shape.cpus_per_rank)
        for node_id in job.placement.node_ids:
            if node_id in free:
                free[node_id] = free[node_id].minus(rank.gpus, rank.cpus)
    return free


class FreePool:
    """Free capacity per node, indexed by free GPUs, so best fit costs O(distinct free-GPU
    counts) instead of O(nodes): the pass places thousands of gangs on thousands of nodes.

    Within one free-GPU count, nodes keep a deterministic order: node id when the pool is
    built, then the order in which they changed.
    """

    def __init__(self, free: FreeMap) -> None:
        self._caps: dict[str, Capacity] = {}
        self._buckets: dict[int, dict[str, None]] = {}
        self._sizes: list[int] = []  # sorted keys of _buckets
        self.total_gpus = 0
        for node_id in sorted(free):
            self._put(node_id, free[node_id])

    @classmethod
    def of(cls, free: FreeMap | FreePool) -> FreePool:
        return free if isinstance(free, FreePool) else cls(free)

    def copy(self) -> FreePool:
        return FreePool(self._caps)

    def as_dict(self) -> dict[str, Capacity]:
        return dict(self._caps)

    def get(self, node_id: str) -> Capacity | None:
        return self._caps.get(node_id)

    def set(self, node_id: str, cap: Capacity) -> None:
        if node_id in self._caps:
            self._pop(node_id)
            self._put(node_id, cap)

    def give(self, node_id: str, cap: Capacity) -> None:
        """Resources come back to a node (ignored for nodes not in the pool: dead)."""
        if node_id in self._caps:
            self._put(node_id, self._pop(node_id).plus(cap))

    def take(self, node_id: str, gpus: int, cpus: float) -> None:
        self._put(node_id, self._pop(node_id).minus(gpus, cpus))

    def largest_gpus(self) -> int:
        return self._sizes[-1] if self._sizes else 0

    def best_fit(self, gpus: int, cpus: float) -> str | None:
        """A node with the fewest free GPUs that still fits `gpus` and `cpus`."""
        for size in self._sizes[bisect.bisect_left(self._sizes, gpus) :]:
            for node_id in self._buckets[size]:
                if self._caps[node_id].cpus >= cpus:
                    return node_id
        return None

    def _put(self, node_id: str, cap: Capacity) -> None:
        self._caps[node_id] = cap
        bucket = self._buckets.get(cap.gpus)
        if bucket is None:
            bucket = self._buckets[cap.gpus] = {}
            bisect.insort(self._sizes, cap.gpus)
        bucket[node_id] = None
        self.total_gpus += cap.gpus

    def _pop(self, node_id: str) -> Capacity:
        cap = self._caps.pop(node_id)
        bucket = self._buckets[cap.gpus]
        del bucket[node_id]
        if not bucket:
            del self._buckets[cap.gpus]
            self._sizes.remove(cap.gpus)
        self.total_gpus -= cap.gpus
        return cap


def free_gpus(free: FreeMap | FreePool) -> int:
    if isinstance(free, FreePool):
        return free.total_gpus
    return sum(cap.gpus for cap in free.values())


def place_gang(shape: GangShape, free: FreeMap | FreePool) -> Placement | None:
    """Place every rank of `shape` or return None; never a partial placement.

    `free` is not changed (groups are taken tentatively and given back).
    """
    if free_gpus(free) < shape.num_gpus:
        return None  # the common case in a busy pass: reject in O(1)
    pool = FreePool.of(free)
    group_gpus = shape.ranks_per_group * shape.gpus_per_rank
    group_cpus = shape.ranks_per_group * shape.cpus_per_rank
    taken: list[str] = []
    try:
        for _ in range(shape.num_ranks // shape.ranks_per_group):
            node_id = pool.best_fit(group_gpus, group_cpus)
            if node_id is None:
                return None
            pool.take(node_id, group_gpus, group_cpus)
            taken.append(node_id)
    finally:
        for node_id in taken:
            pool.take(node_id, -group_gpus, -group_cpus)
    return Placement(tuple(n for n in taken for _ in range(shape.ranks_per_group)))
