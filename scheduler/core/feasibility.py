"""Can a gang ever fit this cluster's shape? The API rejects at submit what never can."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.core.placement import FreePool, place_gang, total_capacity
from scheduler.model import GangShape, Node


def never_fits_reason(shape: GangShape, nodes: Sequence[Node]) -> str | None:
    """None when the gang fits the empty cluster; otherwise why it never can.

    With no nodes known yet (a cluster still coming up) nothing can be judged, so the
    job is accepted and waits.
    """
    if shape.dp_min is not None:  # an elastic job needs only its minimum to run
        shape = shape.with_dp(shape.dp_min)
    alive = [n for n in nodes if n.alive]
    if not alive:
        return None
    total_gpus = sum(n.num_gpus for n in alive)
    if shape.num_gpus > total_gpus:
        return f"the gang needs {shape.num_gpus} GPUs; the cluster has {total_gpus}"
    group_gpus = shape.ranks_per_group * shape.gpus_per_rank
    largest = max(n.num_gpus for n in alive)
    if group_gpus > largest:
        return (
            f"one tensor-parallel group (tp={shape.parallelism.tp} x "
            f"{shape.gpus_per_rank} GPUs per rank) needs {group_gpus} GPUs on one node; "
            f"the largest node has {largest}"
        )
    return _never_places(shape, alive)


def _never_places(shape: GangShape, alive: Sequence[Node]) -> str | None:
    pool = FreePool.of_nodes(total_capacity(alive), alive)
    if not pool.choices(shape):
        assert shape.gpu_types is not None  # a job that names none may go anywhere
        here = ", ".join(sorted({n.gpu_type or "of unknown type" for n in alive}))
        return (
            f"resources.gpu_types asks for {', '.join(sorted(shape.gpu_types))}; "
            f"the cluster's GPUs are {here}"
        )
    if place_gang(shape, pool) is not None:
        return None
    if pool.types is not None and pool.types.mixed and not shape.mix_gpu_types:
        return (
            "the gang does not fit the nodes of any one GPU type even when the cluster is "
            "empty (resources.mix_gpu_types lets one gang span types)"
        )
    return "the gang does not fit the cluster's nodes even when the cluster is empty"
