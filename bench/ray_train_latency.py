"""Submit to first step: Gangway vs Ray Train's TorchTrainer, same model, same Ray.

    .venv/bin/python -m bench.ray_train_latency --steps 30 --repeat 2

Starts one local Ray (2 nodes x 4 logical GPUs, as `gangway serve` embeds). Ray Train:
`TorchTrainer` with 2 workers (1 logical GPU each, gloo) whose loop is Gangway's own
engine (`workers.engine.training.train`, gpt-tiny, dp=2); timed from `fit()` to the first step.
Gangway: `gangway serve` joined to the same Ray, a builtin dp=2 job of the same model and
steps; timed from the client's submit to the first step the API shows (polled every
50 ms). Runs alternate; prints each and the median ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from bench.harness.service import Service
from gangway import Builtin, Client, Parallelism
from scheduler.runtime.local_ray import LocalClusterShape, ray_directory, start_local_cluster


class _FirstStep:
    """A reporter that writes the wall time of the first step to a file (the driver reads
    it: Ray Train's own reporting costs seconds per call)."""

    def __init__(self, path: str) -> None:
        self.path, self.done = path, False

    def should_stop(self) -> bool:
        return False

    def report(self, *, step: int, loss: float | None = None, **metrics: Any) -> None:
        if not self.done:
            Path(self.path).write_text(str(time.time()))
            self.done = True

    def event(self, text: str) -> None:
        """Not needed to time the first step."""


def _train_loop(config: dict[str, Any]) -> None:
    import torch.distributed as dist

    from workers.engine.plan import ParallelPlan
    from workers.engine.training import TrainSpec, train

    reporter = _FirstStep(config["marker"]) if dist.get_rank() == 0 else _FirstStep("/dev/null")
    train(reporter, ParallelPlan(dp=2), TrainSpec(steps=config["steps"]))


def ray_train_first_step_s(steps: int, scratch: Path) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    marker = scratch / f"first-step-{time.time_ns()}"
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"steps": steps, "marker": str(marker)},
        # One logical GPU per worker, as Gangway's ranks get; no CUDA here, so torch
        # stays on CPU and gloo is forced below.
        scaling_config=ScalingConfig(
            num_workers=2, use_gpu=True, resources_per_worker={"CPU": 1, "GPU": 1}
        ),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(storage_path=str(scratch / "ray-train")),
    )
    started = time.time()
    trainer.fit()
    return float(marker.read_text()) - started


def gangway_first_step_s(client: Client, steps: int) -> float:
    started = time.monotonic()
    job = client.submit(
        name="bench", parallelism=Parallelism(dp=2), entrypoint=Builtin(steps=steps)
    )
    while client.get(job.id).progress.step == 0:
        time.sleep(0.05)
    first = time.monotonic() - started
    client.wait(job.id, timeout_s=300, poll_s=0.2)
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = ray_directory(Path(scratch) / "cluster")
        cluster: Any = start_local_cluster(
            LocalClusterShape(num_nodes=2, gpus_per_node=4), directory
        )
        service = Service(data_dir=Path(scratch), ray_address=cluster.address)
        client = service.start(timeout_s=180)
        ratios = []
        try:
            for _ in range(args.repeat):
                ray_train = ray_train_first_step_s(args.steps, Path(scratch))
                gangway = gangway_first_step_s(client, args.steps)
                ratios.append(gangway / ray_train)
                print(f"first step: Ray Train {ray_train:.1f} s, Gangway {gangway:.1f} s")
        finally:
            service.stop()
            ray.shutdown()
            cluster.shutdown()
    print(f"Gangway / Ray Train: median {statistics.median(ratios):.2f} {ratios}")


if __name__ == "__main__":
    main()
