"""Engine vs plain DDP under torchrun, and what FSDP saves per rank.

    .venv/bin/python -m bench.engine_throughput --steps 20 --repeat 3

Runs `bench/engine_worker.py` under `torchrun --nproc-per-node N` in alternating order:
plain DDP (PyTorch tutorial shape), Gangway's engine at dp=2 doing the same work (no
clipping), the engine with its default clipping, plain FSDP2 and the engine with FSDP;
then the engine with FSDP at dp=2 and dp=4 for the state each rank holds. Prints each
run's JSON line and, per pairing, the median ratio engine / plain over the repeats.
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
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    output = done.stdout
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
    ratios: dict[str, list[float]] = {"ddp": [], "ddp+clip": [], "fsdp": []}
    for _ in range(args.repeat):
        plain = torchrun(2, "--mode", "plain", *common)
        engine = torchrun(2, "--mode", "engine", *common)
        with_clip = torchrun(2, "--mode", "engine", *common, "--clip", "1.0")
        plain_fsdp = torchrun(2, "--mode", "plain", "--fsdp", *common)
        engine_fsdp = torchrun(2, "--mode", "engine", "--fsdp", *common)
        ratios["ddp"].append(engine["tokens_per_s"] / plain["tokens_per_s"])
        ratios["ddp+clip"].append(with_clip["tokens_per_s"] / plain["tokens_per_s"])
        ratios["fsdp"].append(engine_fsdp["tokens_per_s"] / plain_fsdp["tokens_per_s"])
    for name, against in (("ddp", "DDP"), ("ddp+clip", "DDP"), ("fsdp", "FSDP")):
        shown = ", ".join(f"{r:.3f}" for r in ratios[name])
        median = statistics.median(ratios[name])
        print(f"engine ({name}) / plain {against} tokens/s: median {median:.3f} [{shown}]")
    for nproc, fsdp in ((2, False), (2, True), (4, True)):
        flags = ["--fsdp"] if fsdp else []
        run = torchrun(nproc, "--mode", "engine", *common, "--steps", "3", "--warmup", "0", *flags)
        kind = f"fsdp={nproc}" if fsdp else f"ddp dp={nproc}"
        print(f"{kind}: params+grads+optimizer state per rank {run['state_mb']:.1f} MiB")


if __name__ == "__main__":
    main()
