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

GPU types: on a cluster of several types, a gang goes on one type (a synchronous gang
steps at its slowest GPU's pace, so mixing wastes the fast ones): a gang of several nodes
on the fastest type it allows that can hold it now (of the places it can start now, the
one where it is predicted to finish first), a one-node gang on the node that fits it most
tightly of any type it allows, the faster type on a tie (`_tightest_first`: fastest first
for small jobs too scattered them over the fast type's whole nodes). Only a job that
allows mixing (`mix_gpu_types`) spans types, and only when no single type holds it. A
type-blind pool (`speed_aware=False`: the baseline the simulator compares against) places
a job that names no types anywhere, as if the cluster had one type.

Free capacity is a `FreePool`: indexed by free GPUs (and by rack), so one pass can place
thousands of gangs on thousands of nodes. Simulations work on copies (principle 6).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple, TypeVar

from scheduler.model import UNKNOWN_GPU_TYPE as UNKNOWN_TYPE
from scheduler.model import GangShape, JobView, Node, Placement

FreeMap = Mapping[str, "Capacity"]
# Where one placement attempt may put ranks: None any node, a type name only nodes of
# that type, a set of names nodes of any of them (a mixed gang over some types).
Kind = str | frozenset[str] | None
_K = TypeVar("_K")


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


class GpuTypes:
    """The GPU types of a pool's nodes, and the order in which a gang tries them: fastest
    first when the pool is speed-aware, by name otherwise. Nodes of no known type are one
    more type, UNKNOWN_TYPE, which no job can name. Never changed once built, so a pool's
    copies share it; the order per (types asked, mixing) is kept."""

    def __init__(self, nodes: Iterable[Node], *, speed_aware: bool = True) -> None:
        alive = [n for n in nodes if n.alive]
        self.of_node = {n.id: n.gpu_type_key for n in alive}
        speeds: dict[str, float] = {}
        for node in alive:
            speeds.setdefault(node.gpu_type_key, node.gpu_speed)
        # Nodes of no known type after typed ones of the same speed (theirs is a guess).
        order = (lambda t: (-speeds[t], not t, t)) if speed_aware else (lambda t: (0.0, False, t))
        self.names = sorted(speeds, key=order)
        self.mixed = len(self.names) > 1
        self.speed_aware = speed_aware
        self._choices: dict[tuple[frozenset[str] | None, bool], tuple[Kind, ...]] = {}

    def choices(self, shape: GangShape) -> tuple[Kind, ...]:
        """Where to try placing `shape`, in order (empty: nowhere on this cluster)."""
        key = (shape.gpu_types, shape.mix_gpu_types)
        found = self._choices.get(key)
        if found is None:
            found = self._choices[key] = self._order(*key)
        return found

    def _order(self, wanted: frozenset[str] | None, mix: bool) -> tuple[Kind, ...]:
        allowed = [t for t in self.names if wanted is None or t in wanted]
        everywhere = len(allowed) == len(self.names)
        if everywhere and (not self.mixed or (wanted is None and not self.speed_aware)):
            return (None,)  # one type here, or a type-blind pool: anywhere, as before types
        kinds: list[Kind] = list(allowed)
        if mix and len(allowed) > 1:
            kinds.append(None if everywhere else frozenset(allowed))
        return tuple(kinds)


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

    def __init__(
        self, free: FreeMap, racks: Mapping[str, str] | None = None, types: GpuTypes | None = None
    ) -> None:
        self._caps: dict[str, Capacity] = {}
        self._racks = dict(racks or {})
        # Indexed by type (and type and rack) only where nodes of several types are.
        self.types = types
        self._type_of = types.of_node if types is not None and types.mixed else {}
        self.mixed = bool(self._type_of)  # nodes of several GPU types
        self._all = _Index()
        self._by_rack: dict[str, _Index] = {}
        self._by_type: dict[str, _Index] = {}
        self._by_type_rack: dict[tuple[str, str], _Index] = {}
        for node_id in sorted(free):
            self._put(node_id, free[node_id])

    @classmethod
    def of_nodes(
        cls, free: FreeMap, nodes: Iterable[Node], *, speed_aware: bool = True
    ) -> FreePool:
        """A pool over `free` that knows the nodes' racks and GPU types."""
        nodes = list(nodes)
        return cls(free, rack_labels(nodes), GpuTypes(nodes, speed_aware=speed_aware))

    @property
    def total_gpus(self) -> int:
        return self._all.total_gpus

    def copy(self) -> FreePool:
        """An independent pool with the same contents and node order (cheap: C-level
        dict copies, no re-indexing)."""
        clone = FreePool({}, None)
        clone._caps = dict(self._caps)
        clone._racks = self._racks  # never changed after construction: safe to share
        clone.types, clone._type_of = self.types, self._type_of  # the same
        clone.mixed = self.mixed
        clone._all = self._all.copy()
        clone._by_rack = {rack: index.copy() for rack, index in self._by_rack.items()}
        clone._by_type = {kind: index.copy() for kind, index in self._by_type.items()}
        clone._by_type_rack = {key: index.copy() for key, index in self._by_type_rack.items()}
        return clone

    def as_dict(self) -> dict[str, Capacity]:
        return dict(self._caps)

    def get(self, node_id: str) -> Capacity | None:
        return self._caps.get(node_id)

    def rack_of(self, node_id: str) -> str | None:
        return self._racks.get(node_id)

    def racks_by_fullness(self, kind: Kind = None) -> list[tuple[int, str]]:
        """(free GPUs, rack), fullest first: best fit at rack level. For one GPU type,
        its GPUs in each rack; for a set of types, every GPU of the rack (a bound)."""
        if isinstance(kind, str):
            return sorted(
                (index.total_gpus, rack)
                for (of_type, rack), index in self._by_type_rack.items()
                if of_type == kind
            )
        return sorted((index.total_gpus, rack) for rack, index in self._by_rack.items())

    def type_gpus(self, kinds: Iterable[Kind]) -> int:
        """Free GPUs on nodes of the given kinds (any node for None)."""
        total = 0
        for kind in set(kinds):
            if kind is None:
                return self.total_gpus
            names = {kind} if isinstance(kind, str) else kind
            total += sum(self._by_type[n].total_gpus for n in names if n in self._by_type)
        return total

    def on_types_of(self, shape: GangShape, placement: Placement) -> GangShape:
        """`shape` kept to the GPU types `placement` is on, unless it may mix them: more
        of a gang (an elastic job's new replica) goes where the rest of it runs."""
        if not self.mixed or shape.mix_gpu_types:
            return shape
        types = frozenset(self._type_of.get(n, UNKNOWN_TYPE) for n in placement.node_ids)
        return replace(shape, gpu_types=types)

    def choices(self, shape: GangShape) -> tuple[Kind, ...]:
        """Where to try placing `shape`, in order (see `GpuTypes.choices`)."""
        if self.types is None:
            return (None,) if shape.gpu_types is None else ()
        return self.types.choices(shape)

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

    def largest_gpus(self, kind: Kind = None) -> int:
        """The most free GPUs on one node (of `kind`, if given)."""
        if isinstance(kind, frozenset):
            return max((self.largest_gpus(name) for name in kind), default=0)
        index = self._all if kind is None else self._by_type.get(kind)
        return index.sizes[-1] if index is not None and index.sizes else 0

    def best_fit(
        self, gpus: int, cpus: float, rack: str | None = None, kind: Kind = None
    ) -> str | None:
        """A node (in `rack`, of `kind`, if given) with the fewest free GPUs that fits."""
        if kind is None:
            index = self._all if rack is None else self._by_rack.get(rack)
        elif isinstance(kind, str):
            by_type = self._by_type.get(kind)
            index = by_type if rack is None else self._by_type_rack.get((kind, rack))
        else:
            return self._best_fit_among(gpus, cpus, rack, kind)
        if index is None or index.total_gpus < gpus:
            return None
        for size in index.sizes[bisect.bisect_left(index.sizes, gpus) :]:
            for node_id in index.buckets[size]:
                if self._caps[node_id].cpus >= cpus:
                    return node_id
        return None

    def _best_fit_among(
        self, gpus: int, cpus: float, rack: str | None, types: frozenset[str]
    ) -> str | None:
        """`best_fit` over the nodes of several types (a mixed gang over some types)."""
        index = self._all if rack is None else self._by_rack.get(rack)
        if index is None or index.total_gpus < gpus:
            return None
        for size in index.sizes[bisect.bisect_left(index.sizes, gpus) :]:
            for node_id in index.buckets[size]:
                of_type = self._type_of.get(node_id, UNKNOWN_TYPE)
                if self._caps[node_id].cpus >= cpus and of_type in types:
                    return node_id
        return None

    def _put(self, node_id: str, cap: Capacity) -> None:
        self._caps[node_id] = cap
        self._all.add(node_id, cap.gpus)
        rack = self._racks.get(node_id)
        if rack is not None:
            _index_of(self._by_rack, rack).add(node_id, cap.gpus)
        kind = self._type_of.get(node_id) if self._type_of else None
        if kind is not None:
            _index_of(self._by_type, kind).add(node_id, cap.gpus)
            if rack is not None:
                _index_of(self._by_type_rack, (kind, rack)).add(node_id, cap.gpus)

    def _pop(self, node_id: str) -> Capacity:
        cap = self._caps.pop(node_id)
        self._all.remove(node_id, cap.gpus)
        rack = self._racks.get(node_id)
        if rack is not None:
            self._by_rack[rack].remove(node_id, cap.gpus)
        kind = self._type_of.get(node_id) if self._type_of else None
        if kind is not None:
            self._by_type[kind].remove(node_id, cap.gpus)
            if rack is not None:
                self._by_type_rack[kind, rack].remove(node_id, cap.gpus)
        return cap


def _index_of(indexes: dict[_K, _Index], key: _K) -> _Index:
    index = indexes.get(key)
    if index is None:
        index = indexes[key] = _Index()
    return index


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
    if not pool.mixed and shape.gpu_types is None:  # one type: the common case
        return _place(shape, pool, None, keep)
    kinds: Sequence[Kind] = pool.choices(shape)
    if len(kinds) > 1 and shape.num_ranks == shape.ranks_per_group:
        kinds = _tightest_first(shape, pool, kinds)
    for kind in kinds:
        placement = _place(shape, pool, kind, keep)
        if placement is not None:
            return placement
    return None


def _tightest_first(shape: GangShape, pool: FreePool, kinds: Sequence[Kind]) -> list[Kind]:
    """A gang on one node: the kinds that have a node for it, by how tightly their best
    node fits it (fewest GPUs left free), then in speed order. Fastest first alone would
    scatter small jobs over the fast type's whole nodes and send the gangs that need whole
    nodes to the slow type (measured on Philly: 2.95 h average JCT against 2.39 h)."""
    gpus, cpus = shape.num_gpus, shape.num_ranks * shape.cpus_per_rank
    fits = []
    for order, kind in enumerate(kinds):
        node_id = pool.best_fit(gpus, cpus, kind=kind)
        cap = pool.get(node_id) if node_id is not None else None
        if cap is not None:
            fits.append((cap.gpus, order, kind))
    return [kind for _, _, kind in sorted(fits, key=lambda fit: fit[:2])]


def _place(shape: GangShape, pool: FreePool, kind: Kind, keep: bool) -> Placement | None:
    if shape.num_ranks == shape.ranks_per_group:  # one group, one node: most jobs
        gpus, cpus = shape.num_gpus, shape.num_ranks * shape.cpus_per_rank
        node_id = pool.best_fit(gpus, cpus, kind=kind)
        if node_id is None:
            return None
        if keep:
            pool.take(node_id, gpus, cpus)
        return Placement((node_id,) * shape.num_ranks)
    for rack_gpus, rack in pool.racks_by_fullness(kind):  # several groups: one rack first
        if rack_gpus >= shape.num_gpus:
            placement = _place_groups(shape, pool, rack, kind, keep)
            if placement is not None:
                return placement
    return _place_groups(shape, pool, None, kind, keep)


def _place_groups(
    shape: GangShape, pool: FreePool, only_rack: str | None, kind: Kind, keep: bool
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
                node_id = _pick(
                    pool, group_gpus, group_cpus, previous, only_rack=only_rack, kind=kind
                )
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
    pool: FreePool,
    gpus: int,
    cpus: float,
    previous: str | None,
    *,
    only_rack: str | None,
    kind: Kind,
) -> str | None:
    if previous is not None:
        left = pool.get(previous)
        if left is not None and left.fits(gpus, cpus):
            return previous
        rack = pool.rack_of(previous)
        if rack is not None:
            node_id = pool.best_fit(gpus, cpus, rack, kind)
            if node_id is not None:
                return node_id
    return pool.best_fit(gpus, cpus, only_rack, kind)
