"""Update modes on 2 gloo ranks: gradient/parameter bytes per step and loss at the same
samples (sync DDP vs local SGD, DiLoCo and the adaptive period, all with period H).

    .venv/bin/python bench/engine_modes.py --model gpt-mini --steps 300 --period 8

With `--slowdown F`, rank 1 computes F times slower (the injected straggler), e.g. async
against sync DDP:

    .venv/bin/python bench/engine_modes.py --modes sync,async --slowdown 2 --steps 100

An async step is one rank's batch, so async runs dp x `--steps` steps (the same samples);
its tokens/s counts every rank's applied updates.

Each mode is one run of `workers.engine.training.train` on 2 processes from the same seed and
the same samples; the loss compared is the mean of the last `--tail` steps' global loss
(one step's loss on 2 x batch samples is noisy). Prints one JSON line per mode, then a
table against sync.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec, train


class Recorder:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        # When each report came, from when the recorder was made: a step's whole loop
        # iteration is the time between two reports.
        self.ended: list[float] = [time.perf_counter()]

    def should_stop(self) -> bool:
        return False

    def report(self, *, step: int, loss: float | None = None, **metrics: Any) -> None:
        self.steps.append({"step": step, "loss": loss, **metrics})
        self.ended.append(time.perf_counter())

    def event(self, text: str) -> None:
        """Printed already by the trainer on rank 0."""


def run(plan: ParallelPlan, spec: TrainSpec, slowdown: dict[int, float]) -> list[dict[str, Any]]:
    """Train on plan.world_size spawned gloo processes; rank 0's per-step reports."""
    with tempfile.TemporaryDirectory() as out:
        job = {"plan": plan, "spec": spec, "port": _free_port(), "out": out, "slow": slowdown}
        mp.start_processes(_rank, args=(job,), nprocs=plan.world_size, start_method="spawn")
        steps: list[dict[str, Any]] = json.loads(Path(out, "rank0.json").read_text())
    return steps


def _rank(rank: int, job: dict[str, Any]) -> None:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    url = f"tcp://127.0.0.1:{job['port']}"
    plan: ParallelPlan = job["plan"]
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=plan.world_size)
    recorder = Recorder()
    train(recorder, plan, job["spec"], slowdown=job["slow"].get(rank, 1.0))
    if rank == 0:
        Path(job["out"], "rank0.json").write_text(json.dumps(recorder.steps))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def summary(name: str, steps: list[dict[str, Any]], tail: int, wall_s: float) -> dict[str, Any]:
    return {
        "mode": name,
        "steps": len(steps),
        "loss_tail": statistics.mean(s["loss"] for s in steps[-tail:]),
        "bytes_per_step": statistics.mean(s["comm_bytes"] for s in steps),
        "comm_s_per_step": statistics.mean(s["comm_s"] for s in steps),
        "step_time_s": statistics.median(s["step_time_s"] for s in steps),
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in steps),
        "tokens_per_s_overall": _overall_rate(steps),
        "final_period": steps[-1].get("sync_period"),
        "loss_head": statistics.mean(s["loss"] for s in steps[:tail]),
        "max_staleness": max((s.get("max_staleness", 0) for s in steps), default=0),
        "updates_dropped": sum(s.get("updates_dropped", 0) for s in steps),
        "wall_s": wall_s,
    }


def _overall_rate(steps: list[dict[str, Any]]) -> float:
    """Tokens over seconds across all reports. A report covers `step - previous step`
    steps (more than 1 in async, where rank 0 reports once per own update)."""
    tokens = seconds = 0.0
    previous = 0
    for s in steps:
        span = s["step_time_s"] * (s["step"] - previous)
        tokens, seconds, previous = tokens + s["tokens_per_s"] * span, seconds + span, s["step"]
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt-mini")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=4, help="per rank")
    parser.add_argument("--period", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tail", type=int, default=20)
    parser.add_argument("--drift-target", type=float, default=0.01)
    parser.add_argument("--modes", default="sync,local-sgd,diloco,adaptive")
    parser.add_argument("--slowdown", type=float, default=1.0, help="rank 1's compute, x")
    parser.add_argument("--max-staleness", type=int, default=4, help="async's bound S")
    args = parser.parse_args()
    results = {}
    for mode in args.modes.split(","):
        plan = ParallelPlan(
            dp=2,
            update_mode=mode,  # type: ignore[arg-type]
            sync_period=args.period,
            drift_target=args.drift_target,
            max_staleness=args.max_staleness,
        )
        spec = TrainSpec(
            model=args.model,
            steps=args.steps * (plan.dp if mode == "async" else 1),
            batch_size=args.batch_size,
            learning_rate=args.lr,
            warmup_steps=10,
            log_every=50,
        )
        began = time.perf_counter()
        steps = run(plan, spec, {1: args.slowdown})
        results[mode] = summary(mode, steps, args.tail, time.perf_counter() - began)
        print(json.dumps(results[mode]), flush=True)
    base = results.get("sync")
    if base is None:
        return
    print(
        f"{'mode':<10} {'bytes/step':>12} {'vs sync':>8} {'loss':>8} {'vs sync':>8} "
        f"{'H end':>6} {'tokens/s':>9} {'vs sync':>8}"
    )
    for r in results.values():
        ratio = r["bytes_per_step"] / base["bytes_per_step"]
        loss = r["loss_tail"] / base["loss_tail"] - 1
        speed = r["tokens_per_s_overall"] / base["tokens_per_s_overall"]
        print(
            f"{r['mode']:<10} {r['bytes_per_step']:>12,.0f} {ratio:>8.3f} "
            f"{r['loss_tail']:>8.4f} {loss:>+8.2%} {r['final_period'] or '-':>6} "
            f"{r['tokens_per_s_overall']:>9,.0f} {speed:>8.2f}"
        )


if __name__ == "__main__":
    main()
