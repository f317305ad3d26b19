"""Elastic data parallelism: pick a degree at admission, shrink before preempting, grow
onto idle GPUs. Tensor- and pipeline-parallel groups stay whole: only replicas come and go.

Ranks are laid out (pp, dp, tp): rank = (stage * dp + replica) * tp + t. Changing dp
re-indexes ranks, so the helpers here map a placement from one dp to another, keeping
every surviving replica on its nodes.
"""

from __future__ import annotations

from scheduler.model import GangShape, Placement


def replica_nodes(shape: GangShape, placement: Placement) -> list[list[str]]:
    """For each replica, the node of each of its ranks in (stage, t) order."""
    dp, tp, pp = shape.parallelism.dp, shape.parallelism.tp, shape.parallelism.pp
    return [
        [
            placement.node_ids[(stage * dp + replica) * tp + t]
            for stage in range(pp)
            for t in range(tp)
        ]
        for replica in range(dp)
    ]


def from_replicas(shape: GangShape, replicas: list[list[str]]) -> Placement:
    """The placement of `len(replicas)` replicas, in rank order."""
    dp, tp, pp = len(replicas), shape.parallelism.tp, shape.parallelism.pp
    nodes = [""] * (dp * tp * pp)
    for replica, ranks in enumerate(replicas):
        for index, node_id in enumerate(ranks):
            stage, t = divmod(index, tp)
            nodes[(stage * dp + replica) * tp + t] = node_id
    return Placement(tuple(nodes))


def shrunk(shape: GangShape, placement: Placement, dp: int) -> Placement:
    """Keep the first `dp` replicas where they are."""
    return from_replicas(shape.with_dp(dp), replica_nodes(shape, placement)[:dp])


def grown(shape: GangShape, placement: Placement, extra: Placement) -> Placement:
    """Add the replicas placed in `extra` (a placement of shape.with_dp(k)) after the
    existing ones."""
    k = len(extra.node_ids) // shape.replica_ranks
    added = replica_nodes(shape.with_dp(k), extra)
    return from_replicas(shape, replica_nodes(shape, placement) + added)
