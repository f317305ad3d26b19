"""Sweep quality and cost (issue 28): a 27-trial ASHA sweep against a 27-point grid run to
completion, and TPE with 16 trials beside them, on the built-in gpt-tiny, learning rate
log-uniform over [1e-5, 3e-1] and batch size in {4, 8, 16}.

Each sweep runs on a fresh embedded service (`gangway serve`, SQLite, local Ray), one
after the other, its trials one at a time by default (`--concurrent`): on a 2-core machine
trials run side by side only slow each other, and GPU-seconds (a trial's time RUNNING x
its GPUs, as the service counts it) would grow with the crowding, not with the searcher.
Printed per sweep: the best validation loss of a trial trained to its whole budget, the
GPU-seconds and optimizer steps all its trials took, the wall time; then ASHA's and TPE's
ratios to the grid.

Validation loss is measured on the first `eval_batches` global batches of the held-out
split, so trials with different batch sizes see different (equally drawn) samples.

    .venv/bin/python -u -m bench.sweep_quality --steps 729 --min-steps 27
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.service import Service
from gangway import Client
from gangway.models import SweepInfo

SPACE = {
    "entrypoint.learning_rate": {"kind": "log_uniform", "low": 1e-5, "high": 3e-1, "points": 9},
    "entrypoint.batch_size": {"kind": "choice", "values": [4, 8, 16]},
}


@dataclass(frozen=True)
class Outcome:
    name: str
    best: float | None
    gpu_seconds: float
    steps: int
    trials: int
    attempts: int
    wall_s: float


def sweep_body(name: str, steps: int, concurrent: int, seed: int, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "base": {
            "name": "tiny",
            "entrypoint": {"kind": "builtin", "model": "gpt-tiny", "steps": steps},
            "checkpoint": {"interval_steps": None, "keep_last": 1},
        },
        "space": SPACE,
        "max_concurrent": concurrent,
        "seed": seed,
        **fields,
    }


def run_sweep(client: Client, body: dict[str, Any], timeout_s: float) -> Outcome:
    started = time.monotonic()
    info = client.submit_sweep(**body)
    while info.state == "RUNNING":
        if time.monotonic() - started > timeout_s:
            client.cancel_sweep(info.id)
            raise TimeoutError(f"sweep {body['name']} still running after {timeout_s} s")
        time.sleep(1.0)
        info = client.sweep(info.id)
    attempts = [client.get(t.job_id).attempt for t in info.trials]
    for trial, tries in zip(info.trials, attempts, strict=True):
        shown = " ".join(f"{k.rsplit('.', 1)[-1]}={v:.3g}" for k, v in trial.params.items())
        value = f"{trial.objective:.4f}" if trial.objective is not None else "-"
        print(
            f"  {info.name} trial {trial.number:2d} {shown:34} {trial.state:9} step "
            f"{trial.step:5d} attempts {tries} {trial.gpu_seconds:6.1f} GPU-s {value}",
            flush=True,
        )
    return outcome(info, sum(attempts), time.monotonic() - started)


def outcome(info: SweepInfo, attempts: int, wall_s: float) -> Outcome:
    return Outcome(
        name=info.name,
        best=info.best.value if info.best else None,
        gpu_seconds=info.gpu_seconds,
        steps=sum(t.step for t in info.trials),
        trials=len(info.trials),
        attempts=attempts,
        wall_s=wall_s,
    )


def on_fresh_service(body: dict[str, Any], timeout_s: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="gangway-sweep-bench-") as scratch:
        service = Service(data_dir=Path(scratch))
        client = service.start()
        try:
            return run_sweep(client, body, timeout_s)
        finally:
            service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=27, help="a trial's whole budget")
    parser.add_argument(
        "--min-steps", type=int, default=None, help="ASHA's first rung (default: steps / 9)"
    )
    parser.add_argument("--concurrent", type=int, default=1)
    parser.add_argument(
        "--sweeps", default="grid,asha,tpe", help="which to run (the ratios need the grid)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=3600)
    args = parser.parse_args()

    common = {"steps": args.steps, "concurrent": args.concurrent, "seed": args.seed}
    runs = [
        sweep_body("grid", searcher="grid", **common),
        sweep_body(
            "asha",
            searcher="random",
            max_trials=27,
            early_stopping={"rule": "asha", "reduction_factor": 3, "min_steps": args.min_steps},
            **common,
        ),
        sweep_body("tpe", searcher="tpe", max_trials=16, **common),
    ]
    wanted = args.sweeps.split(",")
    results = [on_fresh_service(body, args.timeout_s) for body in runs if body["name"] in wanted]
    print(f"gpt-tiny, {args.steps} steps a trial, {args.concurrent} trial(s) at a time")
    print(
        f"{'sweep':6} {'trials':>6} {'attempts':>8} {'best val_loss':>13} {'GPU-s':>8} "
        f"{'steps':>6} {'wall s':>7}"
    )
    for r in results:
        best = f"{r.best:.4f}" if r.best is not None else "-"
        print(
            f"{r.name:6} {r.trials:6d} {r.attempts:8d} {best:>13} {r.gpu_seconds:8.1f} "
            f"{r.steps:6d} {r.wall_s:7.0f}"
        )
    grid = results[0]
    for other in results[1:]:
        if grid.name != "grid" or grid.best is None or other.best is None:
            continue
        print(
            f"{other.name} / grid: best {other.best / grid.best:.3f}x, "
            f"GPU-s {other.gpu_seconds / grid.gpu_seconds:.3f}x, "
            f"steps {other.steps / grid.steps:.3f}x"
        )


if __name__ == "__main__":
    main()
