"""The built-in trainer: a GPT-style model, data parallel with DDP, on synthetic tokens.

The step stays visible (principle 10): batch -> forward -> loss -> backward -> step ->
report. Tensor and pipeline parallel arrive with the hybrid engine; the API rejects them
for this entrypoint until then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from workers.context import RankContext
from workers.data import SyntheticTokens
from workers.gpt import GPT, next_token_loss
from workers.model_configs import MODEL_CONFIGS


@dataclass(frozen=True)
class BuiltinSpec:
    model: str
    steps: int
    batch_size: int = 8
    learning_rate: float = 3e-3
    seed: int = 0

    @classmethod
    def from_entrypoint(cls, entrypoint: dict[str, Any]) -> BuiltinSpec:
        fields = {k: v for k, v in entrypoint.items() if k != "kind"}
        return cls(**fields)


def train_builtin(ctx: RankContext, spec: BuiltinSpec) -> dict[str, Any]:
    config = MODEL_CONFIGS[spec.model]
    device = _device(ctx.local_rank)
    torch.manual_seed(spec.seed)
    model: torch.nn.Module = GPT(config).to(device)
    if ctx.world_size > 1:
        model = DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
    stream = SyntheticTokens(vocab_size=config.vocab_size, seq_len=config.seq_len, seed=spec.seed)
    tokens_per_step = ctx.world_size * spec.batch_size * config.seq_len
    loss_value = float("nan")
    step = 0
    for step in range(1, spec.steps + 1):
        if ctx.should_stop():
            break
        started = time.perf_counter()
        inputs, targets = stream.batch(step=step, rank=ctx.rank, batch_size=spec.batch_size)
        loss = next_token_loss(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        loss_value = _mean_across_ranks(loss.detach(), ctx.world_size)
        elapsed = time.perf_counter() - started
        ctx.report(step=step, loss=loss_value, tokens_per_s=tokens_per_step / elapsed)
    return {"step": step, "loss": loss_value}


def _device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _mean_across_ranks(value: torch.Tensor, world_size: int) -> float:
    if world_size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= world_size
    return float(value.item())
