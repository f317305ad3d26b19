"""How well the step-time model predicts configurations it was not calibrated on.

    .venv/bin/python -m bench.steptime_accuracy --steps 4

Measures real step times of the built-in trainer (gloo CPU ranks, gpt-mini-sized models,
through `bench.harness.engine.run_engine`) on a calibration set of models x plans, fits the
model's coefficients for this machine (`scheduler.predict.steptime.calibrate`), then
measures held-out configurations (models AND plans not in the calibration set) and
prints each prediction against the measurement, the median absolute percentage error,
and the latency of one estimate and of an auto-plan choice.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench.harness.engine import run_engine
from scheduler.predict.steptime import (
    Measured,
    ModelShape,
    NodeType,
    StepPlan,
    auto_plan,
    calibrate,
    mdape,
)
from workers.engine.model_configs import GPTConfig
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec

MODELS = {
    "bench-l4-e256": GPTConfig(vocab_size=8192, seq_len=128, n_layer=4, n_head=4, n_embd=256),
    "bench-l6-e384": GPTConfig(vocab_size=8192, seq_len=256, n_layer=6, n_head=8, n_embd=384),
    # held out
    "bench-l6-e320": GPTConfig(vocab_size=8192, seq_len=256, n_layer=6, n_head=8, n_embd=320),
}
CALIBRATION = (
    ("bench-l4-e256", StepPlan(dp=1)),
    ("bench-l4-e256", StepPlan(dp=2)),
    ("bench-l4-e256", StepPlan(dp=4)),  # more ranks than cores: how sharing costs here
    ("bench-l4-e256", StepPlan(tp=2)),
    ("bench-l4-e256", StepPlan(pp=2, microbatches=2)),
    ("bench-l6-e384", StepPlan(dp=1)),
    ("bench-l6-e384", StepPlan(dp=2, fsdp=True)),
    ("bench-l6-e384", StepPlan(tp=2)),  # a second tensor-parallel run pins a message's cost
)
HELD_OUT = (
    ("bench-l6-e320", StepPlan(dp=2, tp=2)),
    ("bench-l6-e320", StepPlan(pp=2, microbatches=2, schedule="gpipe")),
    ("bench-l6-e320", StepPlan(tp=2, grad_accumulation=2)),
)


def shape(config: GPTConfig) -> ModelShape:
    return ModelShape(**asdict(config))


def measure(name: str, plan: StepPlan, steps: int, folder: Path) -> float:
    """Median step time of the steps after the first (which pays warm-up)."""
    parallel = ParallelPlan(
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        fsdp=plan.fsdp,
        microbatches=plan.microbatches,
        pipeline_schedule=plan.schedule,  # type: ignore[arg-type]
        precision=plan.precision,  # type: ignore[arg-type]
    )
    spec = TrainSpec(
        model=name,
        steps=steps,
        batch_size=plan.batch_size,
        grad_accumulation=plan.grad_accumulation,
        log_every=10**6,
    )
    run = f"{name}-{plan.dp}{plan.tp}{plan.pp}-{plan.grad_accumulation}"
    result = run_engine(parallel, spec, folder / run, models=MODELS)
    step_times = [m["step_time_s"] for m in result["history"] if "step_time_s" in m]
    return statistics.median(step_times[1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    node = NodeType(
        "this machine (CPU, gloo)",
        devices_per_node=8,
        parallel_ranks=os.cpu_count() or 1,
        memory_bytes=8 * 2**30,
        startup_s=10.0,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        runs = [
            Measured(shape(MODELS[name]), plan, measure(name, plan, args.steps, folder))
            for name, plan in CALIBRATION
        ]
        calibration = calibrate(node, runs)
        print(json.dumps({"coefficients": calibration.coefficients, "runs": len(runs)}))
        for run in runs:
            predicted = calibration.step_time_s(run.model, run.plan)
            print(
                f"calibration {run.model.n_layer}L/{run.model.n_embd} {run.plan}: "
                f"measured {run.step_time_s:.3f} s predicted {predicted:.3f} s"
            )
        pairs = []
        for name, plan in HELD_OUT:
            measured = measure(name, plan, args.steps, folder)
            predicted = calibration.step_time_s(shape(MODELS[name]), plan)
            pairs.append((predicted, measured))
            print(
                f"held-out {name} dp={plan.dp} tp={plan.tp} pp={plan.pp} "
                f"m={plan.microbatches} ga={plan.grad_accumulation} {plan.schedule}: "
                f"measured {measured:.3f} s, "
                f"predicted {predicted:.3f} s ({(predicted - measured) / measured:+.0%})",
                flush=True,
            )
    model = shape(MODELS["bench-l6-e320"])
    timed = time.perf_counter()
    calibration.step_time_s(model, HELD_OUT[0][1])
    estimate_ms = (time.perf_counter() - timed) * 1000
    timed = time.perf_counter()
    choice = auto_plan(calibration, model, gpus=8, global_batch=64, steps=1000)
    auto_ms = (time.perf_counter() - timed) * 1000
    print(f"auto plan for 8 GPUs: {choice.reason if choice else 'none fits'}")
    summary = {
        "held_out": len(pairs),
        "held_out_mdape": mdape(pairs),
        "calibration_mdape": mdape(
            (calibration.step_time_s(r.model, r.plan), r.step_time_s) for r in runs
        ),
        "estimate_ms": estimate_ms,
        "auto_plan_ms": auto_ms,
        "wall_s": time.perf_counter() - started,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
