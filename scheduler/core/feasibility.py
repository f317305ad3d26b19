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


def missing_types_reason(shape: GangShape, nodes: Sequence[Node]) -> str | None:
    """Why a job that names GPU types can never run here: no node has any of them, alive
    or not (a type whose nodes are all down for now is waited for, not refused)."""
    here = {n.gpu_type for n in nodes if n.num_gpus}
    if shape.gpu_types is None or not here or shape.gpu_types & here:
        return None
    names = ", ".join(sorted(t or "of no known type" for t in here))
    return f"asks for {', '.join(sorted(shape.gpu_types))}; the cluster's GPUs are {names}"


def _never_places(shape: GangShape, alive: Sequence[Node]) -> str | None:
    pool = FreePool.of_nodes(total_capacity(alive), alive)
    kinds = pool.choices(shape)
    if not kinds or place_gang(shape, pool) is not None:
        return None  # placed, or its types' nodes are all down for now: it waits
    one_type = [kind for kind in kinds if isinstance(kind, str)]
    if len(one_type) > 1 and not shape.mix_gpu_types:
        return (
            "the gang does not fit the nodes of any one GPU type even when the cluster is "
            "empty (resources.mix_gpu_types lets one gang span types)"
        )
    if shape.gpu_types is not None:
        return (
            f"the gang does not fit the nodes of type {', '.join(sorted(shape.gpu_types))} "
            "even when the cluster is empty"
        )
    return "the gang does not fit the cluster's nodes even when the cluster is empty"
