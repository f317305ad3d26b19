"""Run the training engine on N local processes over gloo, as a job's ranks would."""

from __future__ import annotations

import json
import multiprocessing
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import start_processes

from bench.harness.service import free_port
from workers import faults
from workers.engine import item_costs
from workers.engine.model_configs import MODEL_CONFIGS, GPTConfig
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec, train


class _StopAt:
    """A reporter that asks the loop to stop once `stop_at` steps are done, as a
    preemption notice would."""

    def __init__(self, stop_at: int | None) -> None:
        self.stop_at, self.step = stop_at, 0
        self.metrics: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []
        self.events: list[str] = []

    def should_stop(self) -> bool:
        return self.stop_at is not None and self.step >= self.stop_at

    def report(self, *, step: int, loss: float | None = None, **metrics: Any) -> None:
        self.step, self.metrics = step, metrics
        self.history.append(metrics)

    def event(self, text: str) -> None:
        self.events.append(text)


def run_engine(
    plan: ParallelPlan,
    spec: TrainSpec,
    out: Path,
    *,
    checkpoint_dir: Path | None = None,
    own_checkpoint_dirs: bool = False,
    stop_at: int | None = None,
    models: dict[str, GPTConfig] | None = None,
    slowdown: dict[int, float] | None = None,
    item_times: list[float] | None = None,
    rank_faults: dict[int, str] | None = None,
) -> dict[str, Any]:
    """Train on plan.world_size processes; rank 0's result: losses, resumed_from, step,
    and the metrics it reported last (`history`: every step's). `models`: sizes to
    register by name in each rank besides the built-in ones. `slowdown`: rank -> how many
    times slower its compute is made. `item_times`: what every rank's stage balancer
    measures for [embeddings, block pieces..., head], to force a split. `rank_faults`:
    rank -> its `GANGWAY_FAULTS` text (`workers.faults`). `own_checkpoint_dirs`: each
    rank saves into `checkpoint_dir/rank-<r>` alone, as on hosts that share no disk. A
    rank that raises fails the
    call with `torch.multiprocessing.ProcessRaisedException`, its traceback the text."""
    out.mkdir(parents=True, exist_ok=True)
    job = {
        "world": plan.world_size,
        "port": free_port(),
        "plan": asdict(plan),
        "spec": spec,
        "out": str(out),
        "checkpoint_dir": checkpoint_dir,
        "own_checkpoint_dirs": own_checkpoint_dirs,
        "stop_at": stop_at,
        "models": {name: asdict(config) for name, config in (models or {}).items()},
        "slowdown": slowdown or {},
        "item_times": item_times,
        "faults": rank_faults or {},
        "environ": dict(os.environ),
    }
    # The ranks fork from one server process that imported this module (torch and the
    # engine) once, for every call: a spawned rank spent ~2.7 s of CPU on those imports.
    # A forked rank inherits the server's environment, so the caller's is handed on. (The
    # server imports from its working directory, the repository root under scripts/test;
    # from elsewhere the preload fails quietly and each rank imports what it needs.)
    multiprocessing.set_forkserver_preload([__name__])
    start_processes(  # type: ignore[no-untyped-call]
        _rank_main, args=(job,), nprocs=plan.world_size, start_method="forkserver"
    )
    result: dict[str, Any] = json.loads((out / "rank0.json").read_text())
    return result


def _rank_main(rank: int, job: dict[str, Any]) -> None:
    os.environ.clear()
    os.environ.update(job["environ"])
    torch.set_num_threads(1)  # 8 ranks on 2 cores: no oversubscription
    for name, config in job["models"].items():
        MODEL_CONFIGS[name] = GPTConfig(**config)
    if job["item_times"] is not None:
        forced = [item_costs.ItemCost(t, 1) for t in job["item_times"]]
        item_costs.measure_costs = lambda *args, **kwargs: forced
    faults.configure(job["faults"].get(rank, ""))
    url = f"tcp://127.0.0.1:{job['port']}"
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=job["world"])
    try:
        reporter = _StopAt(job["stop_at"])
        own, checkpoint_dir = job["own_checkpoint_dirs"], job["checkpoint_dir"]
        result = train(
            reporter,
            ParallelPlan(**job["plan"]),
            job["spec"],
            checkpoint_dir=checkpoint_dir / f"rank-{rank}"
            if own and checkpoint_dir
            else checkpoint_dir,
            own_checkpoint_dir=own,
            slowdown=job["slowdown"].get(rank, 1.0),
        )
        if rank == 0:
            payload = {
                "losses": result.losses,
                "resumed_from": result.resumed_from,
                "step": result.step,
                "metrics": reporter.metrics,
                "history": reporter.history,
                "events": reporter.events,
            }
            Path(job["out"], "rank0.json").write_text(json.dumps(payload))
        dist.barrier()  # no rank tears gloo down while a peer still talks to it
    finally:
        dist.destroy_process_group()
