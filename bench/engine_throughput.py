"""Engine vs plain DDP under torchrun, and what FSDP saves per rank.

    .venv/bin/python -m bench.engine_throughput --steps 20 --repeat 3

Runs `bench/engine_worker.py` under `torchrun --nproc-per-node N` in alternating order:
plain DDP (PyTorch tutorial shape), Gangway's engine at dp=2 doing the same work (no
clipping), and the engine with its default clipping; then the engine with FSDP at dp=2
and dp=4 for the state each rank holds. Prints each run's JSON line and the
median ratio engine / plain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("engine_worker.py")


def torchrun(nproc: int, *worker_args: str) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(WORKER),
        *worker_args,
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("{"))
    result: dict[str, Any] = json.loads(line)
    print(line, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt-mini")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    common = ["--model", args.model, "--steps", str(args.steps)]
    ratios, clipped = [], []
    for _ in range(args.repeat):
        plain = torchrun(2, "--mode", "plain", *common)
        engine = torchrun(2, "--mode", "engine", *common)
        with_clip = torchrun(2, "--mode", "engine", *common, "--clip", "1.0")
        ratios.append(engine["tokens_per_s"] / plain["tokens_per_s"])
        clipped.append(with_clip["tokens_per_s"] / plain["tokens_per_s"])
    print(f"engine / plain DDP tokens/s: median {statistics.median(ratios):.3f} {ratios}")
    print(f"engine clipping at 1.0 / plain: median {statistics.median(clipped):.3f} {clipped}")
    for nproc, fsdp in ((2, False), (2, True), (4, True)):
        flags = ["--fsdp"] if fsdp else []
        run = torchrun(nproc, "--mode", "engine", *common, "--steps", "3", "--warmup", "0", *flags)
        kind = f"fsdp={nproc}" if fsdp else f"ddp dp={nproc}"
        print(f"{kind}: params+grads+optimizer state per rank {run['state_mb']:.1f} MiB")


if __name__ == "__main__":
    main()
