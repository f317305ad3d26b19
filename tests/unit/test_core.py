"""The pure policy core: table cases plus property tests on random clusters and gangs."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import Capacity, never_fits_reason, place_gang
from scheduler.core.placement import FreePool
from scheduler.model import (
    GangShape,
    JobState,
    JobView,
    Node,
    Parallelism,
    Placement,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def nodes(*gpus: int) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", f"node-{i}", g, 8.0 * g) for i, g in enumerate(gpus))


def job(
    job_id: int,
    *,
    dp: int = 1,
    tp: int = 1,
    priority: int = 0,
    state: JobState = JobState.PENDING,
    placement: tuple[str, ...] | None = None,
    submitted: int = 0,
) -> JobView:
    return JobView(
        id=job_id,
        priority=priority,
        submitted_at=T0 + timedelta(seconds=submitted),
        state=state,
        shape=GangShape(Parallelism(dp=dp, tp=tp)),
        placement=Placement(placement) if placement else None,
    )


def free(**gpus: int) -> dict[str, Capacity]:
    return {node_id: Capacity(g, 100.0) for node_id, g in gpus.items()}


@pytest.mark.parametrize(
    ("shape", "capacity", "expected"),
    [
        # best fit: the fuller node that still fits, keeping n1 whole for a large gang
        (GangShape(Parallelism(dp=2)), free(n0=3, n1=8), ("n0", "n0")),
        # a tp=4 group never straddles nodes: 3 + 3 free is not enough
        (GangShape(Parallelism(tp=4)), free(n0=3, n1=3), None),
        # two tp=2 groups land on two nodes when no node has 4 free
        (GangShape(Parallelism(dp=2, tp=2)), free(n0=2, n1=3), ("n0", "n0", "n1", "n1")),
        # all or nothing: 3 ranks of 1 GPU with only 2 free anywhere
        (GangShape(Parallelism(dp=3)), free(n0=1, n1=1), None),
        # gpus_per_rank counts: 2 ranks x 2 GPUs
        (GangShape(Parallelism(dp=2), gpus_per_rank=2), free(n0=2, n1=2), ("n0", "n1")),
        # ties on free GPUs break by node id
        (GangShape(Parallelism(dp=1)), free(n1=4, n0=4), ("n0",)),
    ],
)
def test_place_gang(
    shape: GangShape, capacity: dict[str, Capacity], expected: tuple[str, ...] | None
) -> None:
    placement = place_gang(shape, capacity)
    assert (placement.node_ids if placement else None) == expected


def test_place_gang_respects_cpus() -> None:
    shape = GangShape(Parallelism(dp=2), cpus_per_rank=4.0)
    assert place_gang(shape, {"n0": Capacity(4, 4.0)}) is None
    assert place_gang(shape, {"n0": Capacity(4, 8.0)}) == Placement(("n0", "n0"))


@given(
    node_gpus=st.lists(st.integers(0, 8), min_size=1, max_size=6),
    dp=st.integers(1, 8),
    tp=st.sampled_from([1, 2, 4, 8]),
)
def test_placement_properties(node_gpus: list[int], dp: int, tp: int) -> None:
    """Placed gangs never overcommit, keep TP groups on one node, and exist whenever the
    per-node group capacity suffices (greedy is exact for equal-size groups)."""
    capacity = {f"n{i}": Capacity(g, 1000.0) for i, g in enumerate(node_gpus)}
    shape = GangShape(Parallelism(dp=dp, tp=tp))
    placement = place_gang(shape, capacity)
    groups_that_fit = sum(g // tp for g in node_gpus)
    assert (placement is not None) == (groups_that_fit >= dp)
    if placement is None:
        return
    assert len(placement.node_ids) == dp * tp
    for node_id, used in Counter(placement.node_ids).items():
        assert used <= capacity[node_id].gpus
    for group in range(dp):
        assert len(set(placement.node_ids[group * tp : (group + 1) * tp])) == 1


@pytest.mark.parametrize(
    ("shape", "cluster", "fragment"),
    [
        (GangShape(Parallelism(dp=9)), nodes(4, 4), "needs 9 GPUs; the cluster has 8"),
        (GangShape(Parallelism(tp=8)), nodes(4, 4), "largest node has 4"),
        (
            GangShape(Parallelism(dp=3, tp=2), gpus_per_rank=1),
            nodes(3, 3),
            "even when the cluster is empty",
        ),
    ],
)
def test_never_fits_reason(shape: GangShape, cluster: tuple[Node, ...], fragment: str) -> None:
    reason = never_fits_reason(shape, cluster)
    assert reason is not None and fragment in reason


def test_never_fits_accepts_what_fits_and_unknown_clusters() -> None:
    assert never_fits_reason(GangShape(Parallelism(dp=2, tp=4)), nodes(4, 4)) is None
    assert never_fits_reason(GangShape(Parallelism(dp=64)), ()) is None
    dead = (Node("n0", "n0", 8, 64.0, alive=False),)
    assert never_fits_reason(GangShape(Parallelism(dp=2)), dead) is None


def test_pipeline_stages_of_a_replica_share_a_node() -> None:
    shape = GangShape(Parallelism(dp=2, tp=2, pp=2))  # group g = stage * dp + replica
    placement = place_gang(shape, free(n0=4, n1=4))
    assert placement is not None
    # ranks 0-1: (stage 0, replica 0), 2-3: (0, 1), 4-5: (1, 0), 6-7: (1, 1)
    assert placement.node_ids == ("n0", "n0", "n1", "n1", "n0", "n0", "n1", "n1")


def test_a_gang_stays_inside_one_rack_when_one_can_hold_it() -> None:
    racks = {"n0": "a", "n1": "a", "n2": "b", "n3": "b"}
    capacity = {
        "n0": Capacity(4, 64.0),
        "n1": Capacity(1, 64.0),
        "n2": Capacity(2, 64.0),
        "n3": Capacity(2, 64.0),
    }
    placement = place_gang(GangShape(Parallelism(dp=2, tp=2)), FreePool(capacity, racks))
    assert placement is not None and set(placement.node_ids) == {"n2", "n3"}  # fullest rack
    capacity["n3"] = Capacity(0, 64.0)  # rack b can no longer hold it; rack a can
    placement = place_gang(GangShape(Parallelism(dp=2, tp=2)), FreePool(capacity, racks))
    assert placement is not None and set(placement.node_ids) == {"n0"}


def test_a_gang_spans_racks_only_when_it_must() -> None:
    racks = {"n0": "a", "n1": "b"}
    capacity = {"n0": Capacity(2, 64.0), "n1": Capacity(2, 64.0)}
    placement = place_gang(GangShape(Parallelism(dp=4)), FreePool(capacity, racks))
    assert placement is not None and sorted(placement.node_ids) == ["n0", "n0", "n1", "n1"]
