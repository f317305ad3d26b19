"""Elastic data parallelism: start at the largest degree that fits, shrink before
preempting, grow onto idle GPUs; TP and PP groups stay whole."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core import Admit, Blocker, PolicyConfig, Preempt, Wait, schedule
from scheduler.core.decisions import Resize
from scheduler.core.elastic import grown, shrunk
from scheduler.model import GangShape, Parallelism, Placement
from tests.unit.builders import NOW, Cluster, pending, running

TWO_BY_FOUR = Cluster().nodes(2, 4).snapshot()


def test_starts_at_the_largest_degree_that_fits() -> None:
    jobs = [running(1, ["n0"] * 3), pending(2, dp=8, dp_min=2)]
    (admit,) = schedule(TWO_BY_FOUR, jobs, NOW)
    assert isinstance(admit, Admit) and len(admit.placement.node_ids) == 5


def test_waits_when_even_its_minimum_does_not_fit() -> None:
    jobs = [
        running(1, ["n0"] * 4, priority=9),
        running(2, ["n1"] * 3, priority=9),
        pending(3, dp=4, dp_min=2),
    ]
    (wait,) = schedule(TWO_BY_FOUR, jobs, NOW)
    assert isinstance(wait, Wait) and wait.explanation.message == "needs 2 GPUs; 1 free now"


def test_shrinks_elastic_jobs_before_preempting_whole_gangs() -> None:
    jobs = [
        running(1, ["n0"] * 4, priority=0),  # rigid, preemptible
        running(2, ["n1"] * 4, priority=0, dp_range=(1, 4)),  # elastic at dp=4
        pending(3, dp=2, priority=5),
    ]
    decisions = schedule(TWO_BY_FOUR, jobs, NOW)
    assert not any(isinstance(d, Preempt) for d in decisions)
    (resize,) = [d for d in decisions if isinstance(d, Resize)]
    assert (resize.job_id, resize.dp, resize.placement.node_ids) == (2, 2, ("n1", "n1"))
    wait = next(d for d in decisions if isinstance(d, Wait))
    assert (
        wait.explanation.blocker is Blocker.PREEMPTING and "shrinking" in wait.explanation.message
    )


def test_grows_onto_idle_gpus_after_the_queue() -> None:
    jobs = [running(1, ["n0"] * 2, dp_range=(1, 6)), pending(2, dp=3)]
    decisions = schedule(TWO_BY_FOUR, jobs, NOW)
    admit = next(d for d in decisions if isinstance(d, Admit))
    assert admit.job_id == 2
    (resize,) = [d for d in decisions if isinstance(d, Resize)]
    assert resize.dp == 5 and len(resize.placement.node_ids) == 5  # 8 - 3 GPUs left


def test_no_resizing_when_turned_off() -> None:
    jobs = [running(1, ["n0"] * 2, dp_range=(1, 6))]
    assert schedule(TWO_BY_FOUR, jobs, NOW, PolicyConfig(elastic_resize=False)) == []


def test_resizing_keeps_tp_and_pp_groups_and_surviving_replicas_in_place() -> None:
    shape = GangShape(Parallelism(dp=3, tp=2, pp=2), dp_min=1, dp_max=4)
    # rank = (stage * dp + replica) * tp + t; replica r lives on node "r{r}"
    nodes = tuple(f"r{((rank // 2) % 3)}" for rank in range(12))
    placement = Placement(nodes)
    smaller = shrunk(shape, placement, 2)
    assert smaller.node_ids == ("r0", "r0", "r1", "r1", "r0", "r0", "r1", "r1")
    bigger = grown(shape, placement, Placement(("x",) * 4))
    expected = tuple(f"{['r0', 'r1', 'r2', 'x'][(rank // 2) % 4]}" for rank in range(16))
    assert bigger.node_ids == expected


def test_grows_once_when_more_gpus_are_coming_soon() -> None:
    elastic = replace(running(1, ["n0"] * 2, dp_range=(1, 6)), predicted_remaining_s=10_000.0)
    ending = replace(running(3, ["n1"] * 4), predicted_remaining_s=60.0)
    assert not schedule(TWO_BY_FOUR, [elastic, ending], NOW)  # waits for n1 rather than grow twice
    later = replace(ending, predicted_remaining_s=1000.0)
    (resize,) = schedule(TWO_BY_FOUR, [elastic, later], NOW)
    assert isinstance(resize, Resize) and resize.dp == 4


def test_a_grow_must_save_more_than_the_restart_costs() -> None:
    almost_done = replace(running(1, ["n0"] * 2, dp_range=(1, 6)), predicted_remaining_s=300.0)
    # dp 2 -> 6 saves 300 x 2/3 = 200 s > 180 s (grace + restart): grows; 240 s left does not.
    (resize,) = schedule(TWO_BY_FOUR, [almost_done], NOW)
    assert isinstance(resize, Resize) and resize.dp == 6
    assert not schedule(TWO_BY_FOUR, [replace(almost_done, predicted_remaining_s=240.0)], NOW)
