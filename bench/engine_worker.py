"""One rank of `bench.engine_throughput`, started by torchrun.

    torchrun --nproc-per-node 2 bench/engine_worker.py --mode engine --model gpt-mini

`--mode plain` is a hand-written DDP loop in the shape of PyTorch's DDP tutorial (model,
DDP, AdamW, forward, backward, step) on the same model and the same samples; `--mode
engine` is Gangway's `workers.engine.training.train` with a plan (dp from the world size, `--fsdp`
for FSDP2). Rank 0 prints one JSON line: median tokens/s after warm-up, and the engine's
per-rank state size and peak memory (RSS on CPU, the allocator's peak on a GPU).

On a lent GPU machine (one prepared run, NCCL, bf16, the ~124M model, tokens/s and MFU):

    torchrun --standalone --nproc-per-node 1 bench/engine_worker.py --mode engine \
        --model gpt-small --precision bf16 --batch-size 16 --steps 30 --clip 1.0
"""

from __future__ import annotations

import argparse
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
from torch.nn.parallel import DistributedDataParallel

from bench.engine_modes import Recorder
from workers.engine.data import SyntheticTokens, rank_slice
from workers.engine.gpt import GPT, next_token_loss
from workers.engine.model_configs import MODEL_CONFIGS
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec, train


def plain_ddp(model_name: str, steps: int, batch_size: int) -> list[float]:
    config = MODEL_CONFIGS[model_name]
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(GPT(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stream = SyntheticTokens(vocab_size=config.vocab_size, seq_len=config.seq_len, seed=0)
    tokens_per_s = []
    for step in range(1, steps + 1):
        started = time.perf_counter()
        first, count = rank_slice((step - 1) * world * batch_size, world * batch_size, rank, world)
        inputs, targets = stream.samples(first, count)
        loss = next_token_loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        tokens_per_s.append(world * batch_size * config.seq_len / (time.perf_counter() - started))
    return tokens_per_s


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
        rates = plain_ddp(args.model, args.steps, args.batch_size)
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
        rates = [s["tokens_per_s"] for s in recorder.steps]
        result["state_mb"] = recorder.steps[-1]["state_mb"]
        result["peak_rss_mb"] = recorder.steps[-1]["peak_memory_mb"]
        result["fsdp"] = args.fsdp
        result["mfu"] = recorder.steps[-1].get("mfu")
    result["tokens_per_s"] = statistics.median(rates[args.warmup :])
    if dist.get_rank() == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
