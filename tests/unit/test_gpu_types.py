"""GPU types: where a gang goes on a cluster of several types, what a job that names
types may use, what it is told while it waits, the seed and measured speeds, and the
simulator's mixed cluster."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import timedelta

import pytest

from scheduler.core import (
    Admit,
    PolicyConfig,
    Resize,
    Wait,
    missing_types_reason,
    never_fits_reason,
    place_gang,
    schedule,
)
from scheduler.core.decisions import Blocker
from scheduler.core.placement import FreePool, total_capacity
from scheduler.model import (
    ClusterSnapshot,
    GangShape,
    JobState,
    JobView,
    Node,
    Parallelism,
    Placement,
    RunInfo,
)
from scheduler.predict.gpu_speeds import measured_speeds, seed_speed, speeds_for
from scheduler.runtime.cluster import node_from_ray
from scheduler.sim.engine import Simulator
from scheduler.sim.jobs import SimConfig
from scheduler.sim.policies import POLICIES
from scheduler.sim.run import type_blind
from scheduler.sim.trace import TraceJob
from tests.unit.builders import NOW, pending


def _node(index: int, gpu_type: str | None, speed: float = 1.0, gpus: int = 8) -> Node:
    return Node(f"n{index}", f"node-{index}", gpus, 64.0, gpu_type=gpu_type, gpu_speed=speed)


# Listed slow type first: node order (ties in best fit) favours the slow one.
MIXED = (_node(0, "A100", 1.0), _node(1, "A100", 1.0), _node(2, "H100", 2.0), _node(3, "H100", 2.0))


def _pool(nodes: tuple[Node, ...] = MIXED, *, speed_aware: bool = True) -> FreePool:
    return FreePool.of_nodes(total_capacity(nodes), nodes, speed_aware=speed_aware)


def _shape(dp: int = 1, tp: int = 1, types: set[str] | None = None, mix: bool = False) -> GangShape:
    kinds = frozenset(types) if types is not None else None
    return GangShape(Parallelism(dp=dp, tp=tp), gpu_types=kinds, mix_gpu_types=mix)


def _types_of(placement_nodes: tuple[str, ...], nodes: tuple[Node, ...] = MIXED) -> set[str | None]:
    by_id = {n.id: n.gpu_type for n in nodes}
    return {by_id[n] for n in placement_nodes}


def test_a_gang_goes_on_the_fastest_type_that_holds_it() -> None:
    placement = place_gang(_shape(dp=2, tp=8), _pool())
    assert placement is not None and _types_of(placement.node_ids) == {"H100"}


def test_a_type_blind_pool_places_as_if_the_cluster_had_one_type() -> None:
    placement = place_gang(_shape(dp=2, tp=8), _pool(speed_aware=False))
    assert placement is not None and _types_of(placement.node_ids) == {"A100"}


def test_a_one_node_job_takes_the_tightest_node_of_any_type_then_the_fastest() -> None:
    pool = _pool()
    pool.take("n0", 6, 0.0)  # an A100 node with 2 GPUs left: the tightest fit for 2
    placement = place_gang(_shape(tp=2), pool)
    assert placement is not None and set(placement.node_ids) == {"n0"}
    placement = place_gang(_shape(tp=4), pool)  # no tight fit: whole nodes tie, H100 wins
    assert placement is not None and _types_of(placement.node_ids) == {"H100"}


def test_a_job_that_names_types_runs_only_on_them() -> None:
    pool = _pool()
    placement = place_gang(_shape(dp=2, tp=8, types={"A100"}), pool)
    assert placement is not None and _types_of(placement.node_ids) == {"A100"}
    assert place_gang(_shape(dp=3, tp=8, types={"A100"}), pool) is None
    assert place_gang(_shape(types={"V100"}), pool) is None


def test_a_gang_spans_types_only_when_allowed_and_no_single_type_holds_it() -> None:
    pool = _pool()
    assert place_gang(_shape(dp=3, tp=8), pool) is None  # 24 GPUs: no type has them
    placement = place_gang(_shape(dp=3, tp=8, mix=True), pool)
    assert placement is not None and _types_of(placement.node_ids) == {"A100", "H100"}
    placement = place_gang(_shape(dp=2, tp=8, mix=True), pool)  # one type holds it
    assert placement is not None and _types_of(placement.node_ids) == {"H100"}


def test_mixing_stays_within_the_types_a_job_names() -> None:
    nodes = (*MIXED, _node(4, "V100", 0.5))
    pool = _pool(nodes)
    shape = _shape(dp=5, tp=8, types={"A100", "V100", "H100"}, mix=True)
    assert place_gang(shape, pool) is not None
    shape = _shape(dp=3, tp=8, types={"A100", "V100"}, mix=True)
    placement = place_gang(shape, pool)
    assert placement is not None and _types_of(placement.node_ids, nodes) == {"A100", "V100"}


def test_a_cluster_of_one_type_places_as_before() -> None:
    nodes = tuple(_node(i, "H100") for i in range(2))
    assert place_gang(_shape(dp=2, tp=8), _pool(nodes)) is not None
    assert place_gang(_shape(dp=2, tp=8, types={"H100", "A100"}), _pool(nodes)) is not None
    untyped = tuple(_node(i, None) for i in range(2))
    assert place_gang(_shape(dp=2, tp=8), _pool(untyped)) is not None
    assert place_gang(_shape(types={"H100"}), _pool(untyped)) is None


def test_copies_keep_the_types_and_their_own_indexes() -> None:
    pool = _pool()
    copy = pool.copy()
    placement = place_gang(_shape(dp=2, tp=8, types={"A100"}), copy, keep=True)
    assert placement is not None and _types_of(placement.node_ids) == {"A100"}
    assert place_gang(_shape(types={"A100"}), copy) is None  # the copy's A100s are taken
    assert place_gang(_shape(dp=2, tp=8, types={"A100"}), pool) is not None  # not the pool's
    assert pool.type_gpus(["A100"]) == 16 and copy.type_gpus(["A100"]) == 0


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        (_shape(dp=3, tp=8), "any one GPU type even when the cluster is empty (resources.mix"),
        (_shape(dp=3, tp=8, types={"H100"}), "the nodes of type H100 even when"),
    ],
)
def test_never_fits_names_the_types(shape: GangShape, fragment: str) -> None:
    reason = never_fits_reason(shape, MIXED)
    assert reason is not None and fragment in reason


def test_a_type_no_node_has_is_refused_and_one_whose_nodes_are_down_waits() -> None:
    reason = missing_types_reason(_shape(types={"V100"}), MIXED)
    assert reason == "asks for V100; the cluster's GPUs are A100, H100"
    down = (*MIXED, replace(_node(4, "V100"), alive=False))
    assert missing_types_reason(_shape(types={"V100"}), down) is None
    assert never_fits_reason(_shape(types={"V100"}), down) is None
    (wait,) = schedule(ClusterSnapshot(down), [_pending(1, _shape(types={"V100"}))], NOW)
    assert isinstance(wait, Wait) and wait.explanation.blocker is Blocker.GPU_TYPE
    assert "GPUs of type V100" in wait.explanation.message
    assert "alive nodes cannot hold it" in wait.explanation.message


def test_never_fits_accepts_a_mixed_gang_the_cluster_holds() -> None:
    assert never_fits_reason(_shape(dp=3, tp=8, mix=True), MIXED) is None


def _pending(job_id: int, shape: GangShape) -> JobView:
    return replace(pending(job_id), shape=shape)


def test_a_job_waiting_for_its_type_is_told_so() -> None:
    held = replace(pending(1, dp=2, tp=8), shape=_shape(dp=2, tp=8, types={"H100"}))
    running = _running_on(2, ("n2", "n3"))
    decisions = schedule(ClusterSnapshot(MIXED), [running, held], NOW)
    wait = next(d for d in decisions if isinstance(d, Wait) and d.job_id == 1)
    assert wait.explanation.blocker is Blocker.GPU_TYPE
    assert "needs 16 GPUs of one type (H100)" in wait.explanation.message
    assert "H100 0" in wait.explanation.message and "16 free in all" in wait.explanation.message


def test_schedule_admits_on_the_fast_type_and_blind_does_not() -> None:
    job = pending(1, dp=2, tp=8)
    (aware,) = schedule(ClusterSnapshot(MIXED), [job], NOW)
    assert isinstance(aware, Admit) and _types_of(aware.placement.node_ids) == {"H100"}
    # the type-blind policy's pool: node order decides, here the slow type
    blind = type_blind(POLICIES["gangway"]).config
    (admit,) = schedule(ClusterSnapshot(MIXED), [job], NOW, blind)
    assert isinstance(admit, Admit) and _types_of(admit.placement.node_ids) == {"A100"}


def _running_on(
    job_id: int, node_ids: tuple[str, ...], *, tp: int = 8, per_node: int | None = None
) -> JobView:
    """A job running `per_node` (default tp) one-GPU ranks on each of `node_ids`."""
    ranks = per_node or tp
    view = pending(job_id, dp=len(node_ids) * ranks // tp, tp=tp)
    return replace(
        view,
        state=JobState.RUNNING,
        placement=Placement(tuple(n for n in node_ids for _ in range(ranks))),
        run=RunInfo(started_at=NOW - timedelta(hours=1)),
        preemptible=False,
    )


def test_seed_speeds_read_the_names_ray_and_labels_use() -> None:
    assert seed_speed("H100") == 1.0
    assert seed_speed("NVIDIA H100 80GB HBM3") == 1.0
    assert seed_speed("GH200") == seed_speed("H200") > 1.0
    assert seed_speed("L40S") != seed_speed("L4")
    assert seed_speed("A100-SXM4-80GB") < 1.0
    assert seed_speed("L40") != seed_speed("L4") and seed_speed("NVIDIA A10") < 0.2
    assert seed_speed(None) == seed_speed("MysteryGPU") == 1.0


def test_measured_speeds_are_step_time_ratios_on_the_seed_scale() -> None:
    assert measured_speeds({"H100": 0.1, "A100": 0.25}) == pytest.approx({"H100": 1, "A100": 0.4})
    # no H100 measured: anchored at the fastest seeded type measured
    got = measured_speeds({"A100": 0.5, "V100": 1.0})
    assert got == pytest.approx({"A100": 0.4, "V100": 0.2})
    # unseeded names: anchored by name, whatever order the nodes came in
    assert measured_speeds({"x": 1.0, "y": 2.0}) == measured_speeds({"y": 2.0, "x": 1.0})
    speeds = speeds_for(["A100", "V100", ""], {"A100": 0.5})
    assert speeds == {"A100": 0.5, "V100": seed_speed("V100"), "": 1.0}


def test_ray_nodes_carry_their_gpu_type() -> None:
    labelled = {
        "NodeID": "a",
        "Alive": True,
        "Resources": {"GPU": 8.0, "CPU": 8.0, "accelerator_type:A100": 1.0},
        "Labels": {"gangway.io/gpu-type": "H100"},
    }
    detected = {**labelled, "Labels": {}}
    plain = {**detected, "Resources": {"GPU": 8.0, "CPU": 8.0}}
    assert [node_from_ray(raw).gpu_type for raw in (labelled, detected, plain)] == [  # type: ignore[union-attr]
        "H100",
        "A100",
        None,
    ]


def _trace(count: int, gpus: int, duration_s: float) -> list[TraceJob]:
    return [TraceJob(i, float(i), gpus, duration_s) for i in range(count)]


def test_the_simulator_runs_a_gang_at_its_slowest_gpus_pace() -> None:
    config = SimConfig(
        nodes=2,
        gpus_per_node=4,
        tick_s=1.0,
        node_types=(("A100", 1), ("H100", 1)),
        gpu_speeds=(("A100", 1.0), ("H100", 2.0)),
    )
    fifo = POLICIES["fifo"]
    fast = Simulator(_trace(1, 4, 3600.0), config, fifo).run()
    assert fast.jobs[0].finish_s == pytest.approx(1800.0)  # on the H100 node
    mixed = Simulator(_trace(1, 8, 3600.0), config, fifo).run()
    assert mixed.jobs[0].finish_s == pytest.approx(3600.0)  # spans both: A100's pace
    blind = Simulator(_trace(1, 4, 3600.0), config, type_blind(fifo)).run()
    assert blind.jobs[0].finish_s == pytest.approx(3600.0)  # node order: the A100 node


def test_the_simulator_checks_its_node_types() -> None:
    with pytest.raises(ValueError, match="cover"):
        SimConfig(nodes=3, gpus_per_node=8, node_types=(("A100", 1),))
    with pytest.raises(ValueError, match="> 0"):
        SimConfig(nodes=1, gpus_per_node=8, gpu_speeds=(("A100", 0.0),))


def test_every_node_type_gets_jobs_under_load() -> None:
    config = SimConfig(nodes=2, gpus_per_node=4, tick_s=1.0, node_types=(("A100", 1), ("H100", 1)))
    result = Simulator(_trace(8, 2, 600.0), config, POLICIES["fifo"]).run()
    speeds = Counter(job.speed for job in result.jobs)
    assert set(speeds) == {seed_speed("A100"), seed_speed("H100")}


def test_a_typed_job_blocked_by_node_shape_is_told_its_types_numbers() -> None:
    busy = _running_on(2, ("n2",), tp=4)  # H100 n2: 4 free; n3: 4 taken by job 3
    other = _running_on(3, ("n3",), tp=4)
    job = _pending(1, _shape(tp=8, types={"H100"}))
    decisions = schedule(ClusterSnapshot(MIXED), [busy, other, job], NOW)
    wait = next(d for d in decisions if isinstance(d, Wait))
    assert wait.explanation.blocker is Blocker.NODE_SHAPE
    assert "8 GPUs of a type it may use are free but the largest free block is 4" in (
        wait.explanation.message
    )


def test_an_elastic_job_grows_only_on_the_type_it_runs_on() -> None:
    nodes = (_node(0, "A100", 0.4), _node(1, "H100", 1.0))
    job = replace(
        _running_on(1, ("n0",), tp=1, per_node=4),
        shape=GangShape(Parallelism(dp=4), dp_min=1, dp_max=12),
        preemptible=True,
    )
    decisions = schedule(ClusterSnapshot(nodes), [job], NOW, PolicyConfig(resize_lookahead_s=0))
    (grow,) = [d for d in decisions if isinstance(d, Resize)]
    assert grow.dp == 8 and set(grow.placement.node_ids) == {"n0"}
    mixing = replace(job, shape=replace(job.shape, mix_gpu_types=True))
    decisions = schedule(ClusterSnapshot(nodes), [mixing], NOW, PolicyConfig(resize_lookahead_s=0))
    (grow,) = [d for d in decisions if isinstance(d, Resize)]
    assert grow.dp == 12 and set(grow.placement.node_ids) == {"n0", "n1"}


def test_only_the_shrinks_that_make_room_on_a_usable_type_are_made() -> None:
    nodes = (_node(0, "A100", 0.4), _node(1, "H100", 1.0))
    elastic = GangShape(Parallelism(dp=8), dp_min=1, dp_max=8)
    on_a100 = replace(_running_on(1, ("n0",), tp=1, per_node=8), shape=elastic, priority=-2)
    on_h100 = replace(_running_on(2, ("n1",), tp=1, per_node=8), shape=elastic, priority=-1)
    job = replace(_pending(3, _shape(tp=4, types={"H100"})), priority=5)
    decisions = schedule(ClusterSnapshot(nodes), [on_a100, on_h100, job], NOW)
    shrinks = [d for d in decisions if isinstance(d, Resize)]
    assert [(d.job_id, d.dp) for d in shrinks] == [(2, 4)]  # job 1's A100s would not help
