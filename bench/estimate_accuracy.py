"""Predictions from the first job (issue 28): how close a fresh service's estimate of a
gpt-mini job is to the time the job then runs, and again after it has history.

One fresh embedded service (`gangway serve`, SQLite, local Ray, its calibration runs on:
`GANGWAY_AUTO_CALIBRATE=true`):

1. it measures its node type itself (`scheduler.runtime.calibration`); the bench waits
   for those runs to end and prints their step times;
2. a gpt-mini job of `--steps` steps with `"parallelism": "auto"`: the estimate (source,
   basis, the plan auto chose), then the job submitted as estimated and run alone;
   measured = its RUNNING time, start to finish, as the service's history counts it;
3. `--history` more finished gpt-mini jobs of `--history-steps` steps (plans and batch
   sizes varied), then the same estimate and run again.

Printed: predicted and measured run time and their ratio at each point.

    .venv/bin/python -m bench.estimate_accuracy --steps 500 --batch 2 --history 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.service import Service
from gangway import Client
from gangway.models import Estimate, JobInfo


def trainer(
    steps: int, batch: int, parallelism: Any = "auto", name: str = "mini"
) -> dict[str, Any]:
    return {
        "name": name,
        "parallelism": parallelism,
        "gpu_budget": 2,
        "entrypoint": {
            "kind": "builtin",
            "model": "gpt-mini",
            "steps": steps,
            "batch_size": batch,
            "eval_every": None,
        },
    }


def wait_for_calibration(client: Client, timeout_s: float) -> list[JobInfo]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = client.list(user="gangway").items
        if runs and all(job.state.is_terminal for job in runs):
            return runs
        time.sleep(2.0)
    raise TimeoutError("calibration runs still going")


def run_time_s(job: JobInfo) -> float:
    assert job.started_at is not None and job.finished_at is not None
    return (job.finished_at - job.started_at).total_seconds()


def estimate_then_run(client: Client, body: dict[str, Any], label: str) -> tuple[float, float]:
    estimate: Estimate = client.estimate(**body)
    prediction = estimate.prediction
    assert prediction is not None and prediction.runtime_s is not None, estimate
    plan = estimate.parallelism
    print(f"{label}: plan dp={plan.dp} tp={plan.tp} pp={plan.pp} ({estimate.plan_reason})")
    print(f"  estimate: {prediction.runtime_s:.1f} s ({prediction.source}: {prediction.basis})")
    job = client.submit(**body)
    finished = client.wait(job.id, timeout_s=3600)
    measured = run_time_s(finished)
    ratio = prediction.runtime_s / measured
    print(f"  measured: {measured:.1f} s; predicted / measured = {ratio:.3f}")
    return prediction.runtime_s, measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--history", type=int, default=5)
    parser.add_argument("--history-steps", type=int, default=60)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gangway-estimate-bench-") as scratch:
        service = Service(data_dir=Path(scratch))
        service.env["GANGWAY_AUTO_CALIBRATE"] = "true"
        client = service.start()
        try:
            runs = wait_for_calibration(client, timeout_s=1800)
            for run in runs:
                rate = run.progress.tokens_per_s
                print(f"calibration {run.name}: {run.state.value}, {rate} tokens/s at the end")
            body = trainer(args.steps, args.batch)
            estimate_then_run(client, body, f"fresh, gpt-mini {args.steps} steps")
            shapes = [{"dp": 1}, {"dp": 2}, {"tp": 2}, {"dp": 2}, {"dp": 1}]
            for index in range(args.history):
                batch = (2, 4)[index % 2]
                past = trainer(args.history_steps, batch, shapes[index % 5], f"past{index}")
                client.wait(client.submit(**past).id, timeout_s=3600)
            estimate_then_run(client, body, f"after {args.history} more finished jobs")
        finally:
            service.stop()


if __name__ == "__main__":
    main()
