"""The simulator on tiny hand-made traces whose schedules are worked out by hand.

Passes run at every event (tick_s=1), so times below are exact.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from scheduler.sim.engine import Simulator
from scheduler.sim.jobs import SimConfig
from scheduler.sim.metrics import compute, jain_index, percentile
from scheduler.sim.policies import POLICIES
from scheduler.sim.trace import TraceFormatError, TraceJob, load_trace

ONE_NODE = SimConfig(nodes=1, gpus_per_node=4, tick_s=1.0, wait_tick_s=1.0)


def run(
    trace: list[TraceJob], policy: str, config: SimConfig = ONE_NODE
) -> dict[int, tuple[float, float]]:
    """job id -> (first start, finish)."""
    result = Simulator(trace, config, POLICIES[policy]).run()
    return {j.trace.job_id: (j.first_start_s, j.finish_s) for j in result.jobs}  # type: ignore[misc]


def test_fifo_with_gangs() -> None:
    trace = [TraceJob(0, 0, 4, 100), TraceJob(1, 10, 1, 10), TraceJob(2, 20, 4, 50)]
    # A holds all 4 GPUs until 100; B (1 GPU) runs 100-110; C (4 GPUs) waits for B: 110-160
    assert run(trace, "fifo") == {0: (0, 100), 1: (100, 110), 2: (110, 160)}
    metrics = compute(Simulator(trace, ONE_NODE, POLICIES["fifo"]).run())
    assert metrics.jct_avg_s == pytest.approx((100 + 100 + 140) / 3)
    assert metrics.longest_wait_s == 90
    assert metrics.makespan_s == 160
    assert metrics.utilization == pytest.approx((400 + 10 + 200) / (4 * 160))


def test_jobs_are_named_by_their_trace_ids_not_their_positions() -> None:
    """A caller's trace may number its jobs as it likes, in any order."""
    trace = [TraceJob(7, 0, 4, 100), TraceJob(3, 10, 1, 10), TraceJob(12, 20, 4, 50)]
    assert run(trace, "fifo") == {7: (0, 100), 3: (100, 110), 12: (110, 160)}
    with pytest.raises(ValueError, match="unique"):
        Simulator([*trace, TraceJob(3, 30, 1, 5)], ONE_NODE, POLICIES["fifo"])


BACKFILL_TRACE = [TraceJob(0, 0, 2, 100), TraceJob(1, 1, 4, 50), TraceJob(2, 2, 2, 30)]


def test_strict_fifo_lets_nothing_pass_the_blocked_head() -> None:
    assert run(BACKFILL_TRACE, "fifo") == {0: (0, 100), 1: (100, 150), 2: (150, 180)}


def test_greedy_backfill_starts_whatever_fits() -> None:
    assert run(BACKFILL_TRACE, "fifo-backfill") == {0: (0, 100), 1: (100, 150), 2: (2, 32)}


def test_easy_backfill_needs_time_limits_to_know_a_job_ends_before_the_reservation() -> None:
    # Without limits C might run past B's reserved start (100), on the GPUs B needs.
    assert run(BACKFILL_TRACE, "slurm-easy")[2] == (150, 180)
    limits = replace(ONE_NODE, time_limit_factor=1.0)
    assert run(BACKFILL_TRACE, "slurm-easy", limits) == {0: (0, 100), 1: (100, 150), 2: (2, 32)}


def test_preemption_loses_work_since_the_last_checkpoint() -> None:
    # Tiresias: A (4 GPUs, 10,000 s) drops to priority 1 after 3,600 GPU-s; B arrives at
    # 1,000 with priority 2 and preempts it. A checkpointed at 600 s of progress: 400 s
    # lost, plus 60 s stopping; B runs 1,060-1,160; A resumes with a 60 s restore and
    # 9,400 s left: ends at 1,160 + 60 + 9,400 = 10,620.
    config = replace(ONE_NODE, checkpoint_interval_s=600, checkpoint_save_s=60, restore_s=60)
    trace = [TraceJob(0, 0, 4, 10_000), TraceJob(1, 1000, 4, 100)]
    result = Simulator(trace, config, POLICIES["tiresias"]).run()
    a, b = result.jobs
    assert (b.first_start_s, b.finish_s) == (1060, 1160)
    assert (a.first_start_s, a.finish_s) == (0, 10_620)
    assert a.preemptions == 1
    metrics = compute(result)
    assert metrics.preemptions == 1
    assert metrics.lost_gpu_hours == pytest.approx((400 + 60) * 4 / 3600)


def test_gangway_preempts_for_service_only_at_a_cheap_moment() -> None:
    # Gangway: A (4 GPUs, 10,000 s) leaves the top service band at 900 s (3,600 GPU-s).
    # B (4 GPUs) arrives at 1,000 in the top band, but preempting A then would throw away
    # 400 s of work (> 300 s allowed): B waits until A checkpoints at 1,200, preempts it
    # (0 s lost, 60 s stopping), runs 1,260-1,360; A resumes with a 60 s restore and
    # 8,800 s left: ends at 1,360 + 60 + 8,800 = 10,220.
    config = replace(ONE_NODE, checkpoint_interval_s=600, checkpoint_save_s=60, restore_s=60)
    trace = [TraceJob(0, 0, 4, 10_000), TraceJob(1, 1000, 4, 100)]
    result = Simulator(trace, config, POLICIES["gangway"]).run()
    a, b = result.jobs
    assert (b.first_start_s, b.finish_s) == (1260, 1360)
    assert (a.first_start_s, a.finish_s) == (0, 10_220)
    assert (a.preemptions, a.waited_s, b.waited_s) == (1, 100, 260)
    assert compute(result).lost_gpu_hours == pytest.approx(60 * 4 / 3600)


def test_gangs_span_nodes_and_racks() -> None:
    config = SimConfig(nodes=2, gpus_per_node=4, nodes_per_rack=1, tick_s=1.0)
    assert run([TraceJob(0, 0, 8, 10)], "gangway", config) == {0: (0, 10)}


def test_count_placement_ignores_node_boundaries() -> None:
    # Best fit packs jobs 0, 1 on one node and 2, 3 on the other; at 50 jobs 0 and 2 end,
    # leaving 2 free GPUs on each node. Consolidated, job 4 is one tensor-parallel group
    # of 4 and waits for a whole node; counted, it takes the 2 + 2 at once.
    ends = (50, 100, 50, 100)
    trace = [TraceJob(i, 0, 2, end) for i, end in enumerate(ends)] + [TraceJob(4, 60, 4, 10)]
    two_nodes = SimConfig(nodes=2, gpus_per_node=4, tick_s=1.0)
    assert run(trace, "fifo", two_nodes)[4] == (100, 110)
    counted = replace(two_nodes, placement="count")
    assert run(trace, "fifo", counted)[4] == (60, 70)
    with pytest.raises(ValueError, match="placement"):
        replace(two_nodes, placement="random")


def test_srsf_with_the_oracle_runs_the_short_job_first() -> None:
    trace = [TraceJob(0, 0, 1, 1000), TraceJob(1, 1, 1, 10)]
    one_gpu = SimConfig(nodes=1, gpus_per_node=1, tick_s=1.0, wait_tick_s=1.0, oracle=True)
    srsf = run(trace, "srsf", one_gpu)
    assert srsf[1][1] < srsf[0][1]
    fifo = run(trace, "fifo", one_gpu)
    assert fifo[1][1] > fifo[0][1]


def test_gittins_learns_its_prior_and_the_report_rates_the_predictor() -> None:
    trace = [TraceJob(i, 40 * i, 1, 100 + i) for i in range(12)]
    result = Simulator(trace, ONE_NODE, POLICIES["gittins"]).run()
    metrics = compute(result)
    assert metrics.jobs == 12
    # The first jobs arrive before any has finished: unknown; later ones get a prediction.
    assert 0 < metrics.predicted_jobs < 12
    assert metrics.prediction_mdape is not None and metrics.prediction_mdape < 0.2


def test_metric_helpers() -> None:
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile([1, 2, 3, 4], 99) == 4
    assert jain_index([2, 2, 2]) == 1.0
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)


def test_trace_formats(tmp_path: Path) -> None:
    subset = tmp_path / "subset.csv"
    subset.write_text("job_id,submit_time,num_gpu,duration,vc\n0,5,2,60,a\n1,3,1,30,b\n2,4,0,9,c\n")
    assert load_trace(subset) == [TraceJob(0, 0, 1, 30, "b"), TraceJob(1, 2, 2, 60, "a")]
    itp = tmp_path / "itp.csv"
    itp.write_text("job_id,submission_time,duration,num_gpu\nx,100,50,8\n")
    assert load_trace(itp) == [TraceJob(0, 0, 8, 50, "default")]
    digest = tmp_path / "digest.csv"
    digest.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,vc1\n2017-10-09 06:13:03,2951.0,2,5902,vc2\n"
    )
    assert load_trace(digest) == [TraceJob(0, 0, 2, 2951, "vc2"), TraceJob(1, 2932, 1, 66, "vc1")]
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="unknown trace columns"):
        load_trace(bad)


def test_simulate_command_prints_writes_json_and_plots(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gangway.cli import app

    trace = tmp_path / "trace.csv"
    trace.write_text(
        "job_id,submit_time,num_gpu,duration,vc\n0,0,2,100,a\n1,1,4,50,b\n2,2,2,30,a\n"
    )
    out = tmp_path / "out"
    args = ["simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "4"]
    result = CliRunner().invoke(
        app, [*args, "--policy", "fifo", "--policy", "gangway", "--tick-s", "1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "fifo" in result.output and "gangway" in result.output
    body = json.loads((out / "result.json").read_text())
    assert [p["policy"] for p in body["policies"]] == ["fifo", "gangway"]
    assert body["policies"][0]["jct_avg_s"] == pytest.approx((100 + 149 + 178) / 3)
    for name in ("jct_cdf.png", "queue_length.png", "utilization.png"):
        assert (out / name).stat().st_size > 1000
    counted = CliRunner().invoke(
        app, [*args, "--policy", "fifo", "--placement", "count", "--out", str(out)]
    )
    assert counted.exit_code == 0, counted.output
    assert json.loads((out / "result.json").read_text())["settings"]["placement"] == "count"
    bad = CliRunner().invoke(app, [*args, "--policy", "nope", "--out", str(out)])
    assert bad.exit_code != 0 and "unknown policy" in str(bad.output) + str(bad.exception)


LIVELOCK_TRACE = [TraceJob(i, 50 * i, (1, 2, 4, 8)[i % 4], 300 + 97 * (i % 13)) for i in range(40)]


def test_srsf_on_predictions_does_not_preempt_back_and_forth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On this trace srsf used to livelock: a job that overran its prediction (remaining
    unknown, so ranked last) was preempted after ~720 s, before its first checkpoint,
    lost everything, ranked short again and preempted the next one, over and over (20,000
    preemptions, no job ended). Now a preemption must pay for the victim's unsaved work."""
    from scheduler.core import Preempt
    from scheduler.sim import engine

    preemptions = 0
    decide = engine.schedule

    def bounded(*args: Any, **kwargs: Any) -> Any:
        nonlocal preemptions
        decisions = decide(*args, **kwargs)
        preemptions += sum(isinstance(d, Preempt) for d in decisions)
        assert preemptions <= len(LIVELOCK_TRACE), "srsf preempts back and forth"
        return decisions

    monkeypatch.setattr(engine, "schedule", bounded)
    config = SimConfig(nodes=2, gpus_per_node=4, tick_s=60.0)
    result = Simulator(LIVELOCK_TRACE, config, POLICIES["srsf"]).run()
    assert all(j.finish_s is not None for j in result.jobs)
    assert sum(j.preemptions for j in result.jobs) == preemptions


def test_start_estimates_change_no_simulated_decision() -> None:
    """The simulator asks the core for no exact ETAs (it reads only Admit and Preempt):
    the same trace with them gives the same schedule, for every policy."""
    trace = LIVELOCK_TRACE
    config = SimConfig(nodes=2, gpus_per_node=4, tick_s=60.0)
    for policy in POLICIES.values():
        fast = Simulator(trace, config, policy).run()
        slow = Simulator(trace, config, policy, eta_jobs=policy.config.eta_jobs).run()
        outcome = [(j.first_start_s, j.finish_s, j.preemptions, j.lost_gpu_s) for j in fast.jobs]
        assert outcome == [
            (j.first_start_s, j.finish_s, j.preemptions, j.lost_gpu_s) for j in slow.jobs
        ], policy.name
