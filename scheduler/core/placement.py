"""Gang placement: all ranks or none, tensor-parallel groups inside one node, best fit,
pipeline stages of one data-parallel replica together, racks respected.

Ranks are laid out (pp, dp, tp) with tp innermost, so one tensor-parallel group is `tp`
consecutive ranks and group g = stage * dp + replica. Placement, in order of preference:

1. the whole gang inside one rack (the fullest rack that holds it: best fit), when nodes
   carry a rack label;
2. otherwise replica by replica: each replica's stages on the node of its previous stage
   while it has room (fewest nodes), else in that stage's rack, else anywhere;
3. each group on the node with the fewest free GPUs that fits it (best fit; ties in a
   deterministic node order), which keeps whole nodes free for large gangs.

Free capacity is a `FreePool`: indexed by free GPUs (and by rack), so one pass can place
thousands of gangs on thousands of nodes. Simulations work on copies (principle 6).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from scheduler.model import GangShape, JobView, Node, Placement

FreeMap = Mapping[str, "Capacity"]


class Capacity(NamedTuple):
    """Free (or used) resources on one node (a tuple: many are made per pass)."""

    gpus: int
    cpus: float

    def fits(self, gpus: int, cpus: float) -> bool:
        return self.gpus >= gpus and self.cpus >= cpus

    def minus(self, gpus: int, cpus: float) -> Capacity:
        return Capacity(self.gpus - gpus, self.cpus - cpus)

    def plus(self, other: Capacity) -> Capacity:
        return Capacity(self.gpus + other.gpus, self.cpus + other.cpus)


NOTHING = Capacity(0, 0.0)


def total_capacity(nodes: Iterable[Node]) -> dict[str, Capacity]:
    return {n.id: Capacity(n.num_gpus, n.num_cpus) for n in nodes if n.alive}


def rack_labels(nodes: Iterable[Node]) -> dict[str, str]:
    return {n.id: n.rack for n in nodes if n.rack}


def usage(shape: GangShape, placement: Placement) -> dict[str, Capacity]:
    """What a placed gang uses on each node."""
    used: dict[str, Capacity] = {}
    rank = Capacity(shape.gpus_per_rank, shape.cpus_per_rank)
    for node_id in placement.node_ids:
        used[node_id] = used.get(node_id, NOTHING).plus(rank)
    return used


def free_capacity(nodes: Iterable[Node], holders: Iterable[JobView]) -> dict[str, Capacity]:
    """Capacity of alive nodes minus what jobs holding placements use."""
    free = total_capacity(nodes)
    for job in holders:
        if job.placement is None:
            continue
        for node_id, cap in usage(job.shape, job.placement).items():
            if node_id in free:
                free[node_id] = free[node_id].minus(cap.gpus, cap.cpus)
    return free


class _Index:
    """Nodes by free GPUs: best fit in O(distinct free-GPU counts)."""

    def __init__(self) -> None:
        self.buckets: dict[int, dict[str, None]] = {}
        self.sizes: list[int] = []  # sorted keys of buckets
        self.total_gpus = 0

    def copy(self) -> _Index:
        clone = _Index()
        clone.buckets = {size: dict(nodes) for size, nodes in self.buckets.items()}
        clone.sizes = list(self.sizes)
        clone.total_gpus = self.total_gpus
        return clone

    def add(self, node_id: str, gpus: int) -> None:
        bucket = self.buckets.get(gpus)
        if bucket is None:
            bucket = self.buckets[gpus] = {}
            bisect.insort(self.sizes, gpus)
        bucket[node_id] = None
        self.total_gpus += gpus

    def remove(self, node_id: str, gpus: int) -> None:
        bucket = self.buckets[gpus]
        del bucket[node_id]
        if not bucket:
            del self.buckets[gpus]
            self.sizes.remove(gpus)
        self.total_gpus -= gpus


class FreePool:
    """Free capacity per node, indexed by free GPUs overall and within each rack.

    Within one free-GPU count, nodes keep a deterministic order: node id when the pool is
    built, then the order in which they changed.
    """

    def __init__(self, free: FreeMap, racks: Mapping[str, str] | None = None) -> None:
        self._caps: dict[str, Capacity] = {}
        self._racks = dict(racks or {})
        self._all = _Index()
        self._by_rack: dict[str, _Index] = {}
        for node_id in sorted(free):
            self._put(node_id, free[node_id])

    @property
    def total_gpus(self) -> int:
        return self._all.total_gpus

    def copy(self) -> FreePool:
        """An independent pool with the same contents and node order (cheap: C-level
        dict copies, no re-indexing)."""
        clone = FreePool({}, None)
        clone._caps = dict(self._caps)
        clone._racks = self._racks  # never changed after construction: safe to share
        clone._all = self._all.copy()
        clone._by_rack = {rack: index.copy() for rack, index in self._by_rack.items()}
        return clone

    def as_dict(self) -> dict[str, Capacity]:
        return dict(self._caps)

    def get(self, node_id: str) -> Capacity | None:
        return self._caps.get(node_id)

    def rack_of(self, node_id: str) -> str | None:
        return self._racks.get(node_id)

    def racks_by_fullness(self) -> list[tuple[int, str]]:
        """(free GPUs, rack), fullest first: best fit at rack level."""
        return sorted((index.total_gpus, rack) for rack, index in self._by_rack.items())

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

    def give_all(self, used: Mapping[str, Capacity]) -> None:
        for node_id, cap in used.items():
            self.give(node_id, cap)

    def take_all(self, used: Mapping[str, Capacity]) -> None:
        for node_id, cap in used.items():
            if node_id in self._caps:
                self.take(node_id, cap.gpus, cap.cpus)

    def without(self, reserved: Mapping[str, Capacity]) -> FreePool:
        """A copy minus what is set aside for a reserved job, never below zero."""
        pool = self.copy()
        for node_id, cap in reserved.items():
            left = pool.get(node_id)
            if left is not None:
                pool.set(
                    node_id,
                    Capacity(max(0, left.gpus - cap.gpus), max(0.0, left.cpus - cap.cpus)),
                )
        return pool

    def largest_gpus(self) -> int:
        return self._all.sizes[-1] if self._all.sizes else 0

    def best_fit(self, gpus: int, cpus: float, rack: str | None = None) -> str | None:
        """A node (in `rack`, if given) with the fewest free GPUs that fits the request."""
        index = self._all if rack is None else self._by_rack.get(rack)
        if index is None or index.total_gpus < gpus:
            return None
        for size in index.sizes[bisect.bisect_left(index.sizes, gpus) :]:
            for node_id in index.buckets[size]:
                if self._caps[node_id].cpus >= cpus:
                    return node_id
        return None

    def _put(self, node_id: str, cap: Capacity) -> None:
        self._caps[node_id] = cap
        self._all.add(node_id, cap.gpus)
        rack = self._racks.get(node_id)
        if rack is not None:
            index = self._by_rack.get(rack)
            if index is None:
                index = self._by_rack[rack] = _Index()
            index.add(node_id, cap.gpus)

    def _pop(self, node_id: str) -> Capacity:
        cap = self._caps.pop(node_id)
        self._all.remove(node_id, cap.gpus)
        rack = self._racks.get(node_id)
        if rack is not None:
            self._by_rack[rack].remove(node_id, cap.gpus)
        return cap


def place_gang(
    shape: GangShape, free: FreePool | FreeMap, *, keep: bool = False
) -> Placement | None:
    """Place every rank of `shape` or return None; never a partial placement.

    A FreePool argument is not changed (groups are taken tentatively and given back),
    unless `keep` is set and the gang was placed: then the pool already has it taken.
    """
    pool = free if isinstance(free, FreePool) else FreePool(free)
    if pool.total_gpus < shape.num_gpus:
        return None  # the common case in a busy pass: reject in O(1)
    if shape.num_ranks == shape.ranks_per_group:  # one group, one node: most jobs
        gpus, cpus = shape.num_gpus, shape.num_ranks * shape.cpus_per_rank
        node_id = pool.best_fit(gpus, cpus)
        if node_id is None:
            return None
        if keep:
            pool.take(node_id, gpus, cpus)
        return Placement((node_id,) * shape.num_ranks)
    for rack_gpus, rack in pool.racks_by_fullness():  # several groups: try one rack first
        if rack_gpus >= shape.num_gpus:
            placement = _place_groups(shape, pool, rack, keep)
            if placement is not None:
                return placement
    return _place_groups(shape, pool, None, keep)


def _place_groups(
    shape: GangShape, pool: FreePool, only_rack: str | None, keep: bool
) -> Placement | None:
    """Replica by replica, stage by stage (see the module docstring); all or nothing."""
    dp, pp = shape.parallelism.dp, shape.parallelism.pp
    group_gpus = shape.ranks_per_group * shape.gpus_per_rank
    group_cpus = shape.ranks_per_group * shape.cpus_per_rank
    node_of_group: dict[int, str] = {}
    placed = False
    try:
        for replica in range(dp):
            previous: str | None = None
            for stage in range(pp):
                node_id = _pick(pool, group_gpus, group_cpus, previous, only_rack)
                if node_id is None:
                    return None
                pool.take(node_id, group_gpus, group_cpus)
                node_of_group[stage * dp + replica] = node_id
                previous = node_id
        placed = True
    finally:
        if not (placed and keep):
            for node_id in node_of_group.values():
                pool.take(node_id, -group_gpus, -group_cpus)
    per_group = shape.ranks_per_group
    return Placement(tuple(node_of_group[rank // per_group] for rank in range(shape.num_ranks)))


def _pick(
    pool: FreePool, gpus: int, cpus: float, previous: str | None, only_rack: str | None
) -> str | None:
    if previous is not None:
        left = pool.get(previous)
        if left is not None and left.fits(gpus, cpus):
            return previous
        rack = pool.rack_of(previous)
        if rack is not None:
            node_id = pool.best_fit(gpus, cpus, rack)
            if node_id is not None:
                return node_id
    return pool.best_fit(gpus, cpus, only_rack)
