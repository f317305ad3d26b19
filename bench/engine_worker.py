"""One rank of `bench.engine_throughput`, started by torchrun.

    torchrun --nproc-per-node 2 bench/engine_worker.py --mode engine --model gpt-mini

`--mode plain` is a hand-written loop in the shape of PyTorch's DDP tutorial (model,
DDP, AdamW, forward, backward, step; with `--fsdp`, FSDP2's `fully_shard` instead of DDP)
on the same model and the same samples; `--mode
engine` is Gangway's `workers.engine.training.train` with a plan (dp from the world size, `--fsdp`
for FSDP2). Rank 0 prints one JSON line: median tokens/s after warm-up, and the engine's
per-rank state size and peak memory (RSS on CPU, the allocator's peak on a GPU). Both
count a step from the moment the one before it ended, so whatever the engine does
between steps is in its figure.

On a lent GPU machine (one prepared run, NCCL, bf16, the ~124M model, tokens/s and MFU):

    torchrun --standalone --nproc-per-node 1 bench/engine_worker.py --mode engine \
        --model gpt-small --precision bf16 --batch-size 16 --steps 30 --clip 1.0
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from bench.engine_modes import Recorder
from workers.engine.data import SyntheticTokens, rank_slice
from workers.engine.gpt import GPT, next_token_loss
from workers.engine.model_configs import MODEL_CONFIGS
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec, train


def plain_loop(model_name: str, steps: int, batch_size: int, *, fsdp: bool) -> list[float]:
    """PyTorch's tutorial loop: DDP, or FSDP2 (`fully_shard` on each block, then the
    root, as its tutorial and the engine shard)."""
    config = MODEL_CONFIGS[model_name]
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model: torch.nn.Module = GPT(config)
    if fsdp:
        for block in model.blocks.values():  # type: ignore[operator]
            fully_shard(block)
        fully_shard(model)
    else:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stream = SyntheticTokens(vocab_size=config.vocab_size, seq_len=config.seq_len, seed=0)
    ended = [time.perf_counter()]
    for step in range(1, steps + 1):
        first, count = rank_slice((step - 1) * world * batch_size, world * batch_size, rank, world)
        inputs, targets = stream.samples(first, count)
        loss = next_token_loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ended.append(time.perf_counter())
    return rates(ended, world * batch_size * config.seq_len)


def rates(ended: list[float], tokens_per_step: int) -> list[float]:
    """Tokens/s of each step from the moments consecutive steps ended: the whole loop
    iteration, with whatever a loop does between its steps (the engine's stop agreement,
    reports, metrics), not only the step's own work."""
    return [tokens_per_step / (b - a) for a, b in itertools.pairwise(ended)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["plain", "engine"], required=True)
    parser.add_argument("--model", default="gpt-mini")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--clip", type=float, default=None, help="engine's max_grad_norm")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()
    if torch.cuda.is_available():  # a lent GPU machine: NCCL, one GPU per rank
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
        dist.init_process_group("gloo")
    result: dict[str, Any] = {"mode": args.mode, "world": dist.get_world_size()}
    if args.mode == "plain":
        step_rates = plain_loop(args.model, args.steps, args.batch_size, fsdp=args.fsdp)
    else:
        recorder = Recorder()
        plan = ParallelPlan(dp=dist.get_world_size(), fsdp=args.fsdp, precision=args.precision)
        spec = TrainSpec(
            model=args.model,
            steps=args.steps,
            batch_size=args.batch_size,
            max_grad_norm=args.clip,  # off by default: the plain loop does not clip
        )
        train(recorder, plan, spec)
        config = MODEL_CONFIGS[args.model]
        tokens_per_step = dist.get_world_size() * args.batch_size * config.seq_len
        step_rates = rates(recorder.ended, tokens_per_step)
        result["state_mb"] = recorder.steps[-1]["state_mb"]
        result["peak_rss_mb"] = recorder.steps[-1]["peak_memory_mb"]
        result["fsdp"] = args.fsdp
        result["mfu"] = recorder.steps[-1].get("mfu")
    result["tokens_per_s"] = statistics.median(step_rates[args.warmup :])
    if dist.get_rank() == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
