"""The runtime predictor, the Gittins table and the step-time model, on hand-made data."""

from __future__ import annotations

import pytest

from scheduler.core.gittins import GittinsTable
from scheduler.predict.runtime import JobFeatures, RuntimePredictor, accuracy
from scheduler.predict.steptime import (
    Calibration,
    Measured,
    ModelShape,
    NodeType,
    StepPlan,
    assumed,
    auto_plan,
    calibrate,
    error_floor,
    memory_bytes,
    refine,
    work,
)

ALICE = JobFeatures(queue="q", user="alice", name="bert", num_gpus=4)


def test_unknown_until_enough_similar_jobs_then_the_most_specific_group() -> None:
    predictor = RuntimePredictor(min_samples=2)
    assert not predictor.predict(ALICE).known
    predictor.observe(JobFeatures(queue="q", user="bob", num_gpus=4), 1000.0)
    predictor.observe(JobFeatures(queue="q", user="bob", num_gpus=4), 3000.0)
    by_queue = predictor.predict(ALICE)
    assert by_queue.runtime_s == 1000.0 and "queue, GPU count" in by_queue.basis
    for runtime in (100.0, 200.0, 300.0):
        predictor.observe(ALICE, runtime)
    own = predictor.predict(ALICE)
    assert (own.low_s, own.runtime_s, own.high_s) == (100.0, 200.0, 300.0)
    assert "user, name, GPU count" in own.basis
    # Conditional on having run 250 s: only the 300 s job ran longer (1 < min_samples
    # there), so the next group (user, name) answers likewise: 300 s.
    assert predictor.predict(ALICE, elapsed_s=250.0).runtime_s == 300.0
    assert not predictor.predict(ALICE, elapsed_s=5000.0).known


def test_window_forgets_old_runtimes() -> None:
    predictor = RuntimePredictor(window=2, min_samples=1)
    for runtime in (10.0, 1000.0, 1000.0):
        predictor.observe(ALICE, runtime)
    assert predictor.predict(ALICE).low_s == 1000.0


def test_accuracy_median_error_and_rank_correlation() -> None:
    result = accuracy([(110.0, 100.0), (180.0, 200.0), (300.0, 300.0), (None, 5.0)])
    assert result.predicted == 3 and result.unknown == 1
    assert result.median_ape == pytest.approx(0.1)
    assert result.spearman == pytest.approx(1.0)


def test_gittins_prefers_jobs_likely_to_finish_soon() -> None:
    table = GittinsTable([10.0] * 9 + [10_000.0])
    # New jobs are most likely short: high index. Past 10 s, only the long one is left.
    assert table.index(0.0) > table.index(50.0) > 0
    with pytest.raises(ValueError):
        GittinsTable([])


MODEL = ModelShape(vocab_size=8192, seq_len=128, n_layer=4, n_head=8, n_embd=256)
NODE = NodeType("test", devices_per_node=8, parallel_ranks=8, memory_bytes=2**30)


def test_calibration_recovers_the_coefficients_it_was_made_with() -> None:
    truth = (2e-11, 1e-9, 1e-3, 0.01)
    plans = [StepPlan(dp=2), StepPlan(tp=2), StepPlan(pp=2, microbatches=2), StepPlan()]
    plans.append(StepPlan(dp=2, fsdp=True))
    runs = [
        Measured(
            MODEL, p, float(sum(c * w for c, w in zip(truth, work(MODEL, p, NODE), strict=True)))
        )
        for p in plans
    ]
    calibration = calibrate(NODE, runs)
    unseen = StepPlan(dp=2, tp=2)
    expected = sum(c * w for c, w in zip(truth, work(MODEL, unseen, NODE), strict=True))
    assert calibration.step_time_s(MODEL, unseen) == pytest.approx(expected, rel=1e-6)


def test_pipeline_bubble_shrinks_with_microbatches_and_fsdp_saves_memory() -> None:
    few, many = StepPlan(pp=4, microbatches=1), StepPlan(pp=4, microbatches=8)
    assert work(MODEL, few, NODE)[0] > work(MODEL, many, NODE)[0]
    assert memory_bytes(MODEL, StepPlan(dp=4, fsdp=True)) < memory_bytes(MODEL, StepPlan(dp=4))


def test_refine_moves_from_the_prediction_to_the_observed_steps() -> None:
    assert refine(1.0, []) == 1.0
    assert refine(1.0, [2.0] * 5) == pytest.approx(1.5)
    assert refine(1.0, [2.0] * 95) == pytest.approx(1.95)


def test_auto_plan_picks_the_fastest_plan_that_fits() -> None:
    calibration = calibrate(NODE, [Measured(MODEL, StepPlan(), 1.0)])
    # Only compute counts with one run: more data-parallel ranks is faster.
    choice = auto_plan(calibration, MODEL, gpus=4, global_batch=32, steps=100)
    assert choice is not None and choice.plan.world == 4
    assert "fit memory" in choice.reason
    tiny = NodeType("tiny", 8, 8, memory_bytes=1.0)
    assert (
        auto_plan(
            calibrate(tiny, [Measured(MODEL, StepPlan(), 1.0)]),
            MODEL,
            gpus=4,
            global_batch=32,
            steps=1,
        )
        is None
    )


def test_auto_plan_offers_only_plans_the_engine_runs() -> None:
    """`runnable` (the service passes the engine's plan check) filters every candidate:
    the pick, the count of plans considered and the reason follow it."""
    calibration = calibrate(NODE, [Measured(MODEL, StepPlan(), 1.0)])
    free = auto_plan(calibration, MODEL, gpus=4, global_batch=32, steps=100)
    assert free is not None and free.plan.pp == 1  # more dp is faster with compute alone
    pipelines = auto_plan(
        calibration,
        MODEL,
        gpus=4,
        global_batch=32,
        steps=100,
        schedule="zbv",
        runnable=lambda plan: plan.pp == 2 and plan.microbatches >= 2,
    )
    assert pipelines is not None
    assert (pipelines.plan.pp, pipelines.plan.schedule) == (2, "zbv")
    assert pipelines.plan.microbatches >= 2
    nothing = auto_plan(
        calibration, MODEL, gpus=4, global_batch=32, steps=1, runnable=lambda plan: False
    )
    assert nothing is None


def test_a_fit_says_its_error_and_assumed_speeds_say_theirs_is_unknown() -> None:
    """The expected error is the fit's median relative miss on its runs, at least the
    floor (20% with no more runs than terms, shrinking with each run beyond); assumed
    speeds price each term at a rate and claim no error."""
    node = NodeType("n", 4, 4, 80 * 2**30)
    truth = Calibration(node, (1e-12, 1e-9, 1e-4, 0.01), runs=0)
    runs = [
        Measured(
            MODEL,
            StepPlan(dp=dp, batch_size=b),
            truth.step_time_s(MODEL, StepPlan(dp=dp, batch_size=b)) * noise,
        )
        for (dp, b), noise in zip(
            [(1, 8), (2, 8), (4, 8), (1, 32), (2, 32), (4, 32)],
            (1.0, 1.2, 0.9, 1.1, 1.0, 0.8),
            strict=True,
        )
    ]
    fitted = calibrate(node, runs)
    misses = sorted(
        abs(fitted.step_time_s(r.model, r.plan) - r.step_time_s) / r.step_time_s for r in runs
    )
    assert fitted.expected_error == pytest.approx(max((misses[2] + misses[3]) / 2, 0.2 / 3))
    assert "6 recorded runs, expected error" in fitted.describe()
    exact = calibrate(node, runs[:4])  # as many runs as terms: matched exactly, says nothing
    assert exact.expected_error == pytest.approx(0.20)
    assert [error_floor(n) for n in (3, 4, 5, 6, 10)] == pytest.approx(
        [0.2, 0.2, 0.1, 0.2 / 3, 0.05]
    )

    gpu, cpu = assumed(node), assumed(NodeType("c", 8, 8, 2**34, gpu=False))
    assert gpu.runs == 0 and gpu.expected_error is None
    assert "not measured: error unknown" in gpu.describe()
    plan = StepPlan(dp=2, batch_size=8)
    assert cpu.step_time_s(MODEL, plan) > 50 * gpu.step_time_s(MODEL, plan)


def test_a_term_no_run_exercised_keeps_its_assumed_price() -> None:
    """One-device nodes calibrate with dp=1 only: no bytes sent, no messages. The fit must
    not call communication free, or every data-parallel plan would look costless."""
    node = NodeType("one", 1, 1, 80 * 2**30)
    runs = [Measured(MODEL, StepPlan(batch_size=b), 0.01 * b + 0.02) for b in (2, 4, 8, 16)]
    fitted = calibrate(node, runs)
    prior = assumed(node)
    assert fitted.coefficients[1:3] == prior.coefficients[1:3]  # bytes, messages
    wide = StepPlan(dp=8, batch_size=8)
    assert fitted.step_time_s(MODEL, wide) > fitted.step_time_s(MODEL, StepPlan(batch_size=8))
