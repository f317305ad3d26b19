"""The optimizer, its learning-rate schedule and the parameter and gradient iterators of
a built-in job's model parts."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from workers.engine.training import TrainSpec


def build_optimizer(
    part: nn.Module, spec: TrainSpec, *, fused: bool = False
) -> torch.optim.Optimizer:
    if spec.optimizer == "sgd":
        return torch.optim.SGD(
            part.parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay
        )
    return torch.optim.AdamW(
        part.parameters(),
        lr=spec.learning_rate,
        weight_decay=spec.weight_decay,
        fused=fused or None,  # None: torch's default (for-loop on CPU, foreach on CUDA)
    )


def lr_schedule(
    optimizer: torch.optim.Optimizer, spec: TrainSpec
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine decay to `min_lr_ratio` of the peak at the last step."""

    def factor(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        span = max(1, spec.steps - spec.warmup_steps)
        progress = min(1.0, (step - spec.warmup_steps) / span)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return spec.min_lr_ratio + (1 - spec.min_lr_ratio) * cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def parameters_of(parts: Sequence[nn.Module]) -> Iterator[nn.Parameter]:
    for part in parts:
        yield from part.parameters()


def gradients_of(parts: Sequence[nn.Module]) -> Iterator[torch.Tensor]:
    for param in parameters_of(parts):
        if param.grad is not None:
            yield param.grad
