"""The scheduling core with predicted run times: ends on the timeline, service orders,
preemptions that must pay for themselves."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core import Admit, PolicyConfig, Preempt, Wait, schedule
from scheduler.core.gittins import GittinsTable
from scheduler.core.ordering import queue_order
from scheduler.core.timeline import expected_end
from tests.unit.builders import NOW, Cluster, at, pending, running

# The rules that use predictions, on (the default leaves them off: BENCHMARKS.md, issue 30).
CONFIG = PolicyConfig(elastic_resize=False, shortest_predicted_first=True, preemption_payoff=True)


def test_a_prediction_sets_the_expected_end_when_nothing_better_is_known() -> None:
    job = replace(running(1, ["n0"]), predicted_remaining_s=600.0)
    assert expected_end(job, NOW, CONFIG) == at(600)
    limited = replace(job, time_limit_s=7200.0)  # started an hour ago: ends in one more
    assert expected_end(limited, NOW, CONFIG) == at(3600)
    unknown = running(1, ["n0"])
    assert expected_end(unknown, NOW, CONFIG) == at(-3600 + CONFIG.default_runtime_s)


def test_eta_of_a_blocked_job_comes_from_the_running_jobs_prediction() -> None:
    cluster = Cluster().nodes(1, 1).snapshot()
    holder = replace(running(1, ["n0"]), predicted_remaining_s=900.0)
    decisions = schedule(cluster, [holder, pending(2)], NOW, CONFIG)
    wait = next(d for d in decisions if isinstance(d, Wait))
    assert wait.estimated_start_at == at(900)


def test_shortest_predicted_first_within_a_band_unknown_last() -> None:
    jobs = [
        replace(pending(1), predicted_remaining_s=5000.0),
        pending(2),
        replace(pending(3, dp=2), predicted_remaining_s=1000.0),  # 2000 GPU-s
        replace(pending(4), predicted_remaining_s=1500.0),
    ]
    assert [j.id for j in queue_order(jobs, NOW, CONFIG)] == [4, 3, 1, 2]
    submit_order = replace(CONFIG, shortest_predicted_first=False)
    assert [j.id for j in queue_order(jobs, NOW, submit_order)] == [1, 2, 3, 4]


def test_gittins_order_within_a_band() -> None:
    table = GittinsTable([100.0] * 8 + [50_000.0] * 2)
    config = replace(CONFIG, service_order="gittins", gittins=table)
    fresh = pending(1, submitted=-10)
    past_the_short_ones = replace(pending(2, submitted=-20), attained_gpu_s=500.0)
    assert [j.id for j in queue_order([past_the_short_ones, fresh], NOW, config)] == [1, 2]


def test_srsf_preempts_the_job_with_more_remaining_service() -> None:
    cluster = Cluster().nodes(1, 1).snapshot()
    long = replace(running(1, ["n0"]), predicted_remaining_s=10_000.0)
    short = replace(pending(2), predicted_remaining_s=100.0)
    config = replace(CONFIG, service_order="srsf", min_runtime_s=0, service_preemption_loss_s=1e9)
    assert any(isinstance(d, Preempt) for d in schedule(cluster, [long, short], NOW, config))
    almost_done = replace(long, predicted_remaining_s=50.0)
    decisions = schedule(cluster, [almost_done, short], NOW, config)
    assert not any(isinstance(d, Preempt | Admit) for d in decisions)


def test_a_preemption_for_service_must_pay_for_itself() -> None:
    cluster = Cluster().nodes(1, 1).snapshot()
    # The victim has sunk below the top band (2 GPU-hours attained) and just checkpointed.
    victim = replace(running(1, ["n0"], started=-7200), predicted_remaining_s=400.0)
    newcomer = replace(pending(2), predicted_remaining_s=300.0)
    paying = replace(CONFIG, service_preemption_loss_s=1e9)
    regardless = replace(paying, preemption_payoff=False)
    assert any(
        isinstance(d, Preempt) for d in schedule(cluster, [victim, newcomer], NOW, regardless)
    )
    # 400 s left vs 300 s + grace 120 + restart 60 + lost work: not worth it.
    assert not any(
        isinstance(d, Preempt) for d in schedule(cluster, [victim, newcomer], NOW, paying)
    )
    unknown_victim = replace(victim, predicted_remaining_s=None)  # counts as long
    assert any(
        isinstance(d, Preempt) for d in schedule(cluster, [unknown_victim, newcomer], NOW, paying)
    )
    # A newcomer of unknown length is not known to be shorter than a known victim; with
    # neither known, service order alone decides (least attained service).
    unknown_newcomer = replace(newcomer, predicted_remaining_s=None)
    long_victim = replace(victim, predicted_remaining_s=5000.0)
    for jobs, preempts in (
        ([long_victim, unknown_newcomer], False),
        ([unknown_victim, unknown_newcomer], True),
    ):
        decisions = schedule(cluster, jobs, NOW, paying)
        assert any(isinstance(d, Preempt) for d in decisions) is preempts


def test_srsf_preemption_counts_the_victims_unsaved_work() -> None:
    """The simulator's srsf: payoff rule and checkpoint window on. A victim that overran
    every prediction (remaining unknown, so long) 720 s past its last checkpoint keeps
    its GPUs; a known one is preempted only if it pays for the work it would lose."""
    cluster = Cluster().nodes(1, 1).snapshot()
    srsf = replace(CONFIG, service_order="srsf", min_runtime_s=0, shortest_predicted_first=False)
    newcomer = replace(pending(2), predicted_remaining_s=300.0)
    overrun = running(1, ["n0"], started=-720, step=720, step_time_s=1.0)
    decisions = schedule(cluster, [overrun, newcomer], NOW, srsf)
    assert not any(isinstance(d, Preempt) for d in decisions)
    checkpointed = running(1, ["n0"], started=-1900, step=100, step_time_s=1.0)
    decisions = schedule(cluster, [checkpointed, newcomer], NOW, srsf)
    preempt = next(d for d in decisions if isinstance(d, Preempt))
    assert "shortest remaining first" in preempt.reason
    # Known: 700 s left vs 300 s + grace 120 + restart 60 + 100 s lost = 580 s: it pays;
    # 500 s left does not.
    for left, preempts in ((700.0, True), (500.0, False)):
        victim = replace(checkpointed, predicted_remaining_s=left)
        decisions = schedule(cluster, [victim, newcomer], NOW, srsf)
        assert any(isinstance(d, Preempt) for d in decisions) is preempts
