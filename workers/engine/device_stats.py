"""A rank's device and what it reports about it: state bytes, peak memory, peak FLOP/s
(for MFU)."""

from __future__ import annotations

import resource
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from workers.engine.optim import parameters_of

# Dense bf16 peak FLOP/s by device name fragment, for MFU (per GPU).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def state_bytes(parts: Sequence[nn.Module], optimizers: list[torch.optim.Optimizer]) -> int:
    """Bytes of parameters, gradients and optimizer state this rank holds (its shards
    under FSDP or TP): what sharding divides."""
    total = 0
    for param in parameters_of(parts):
        for tensor in (param, param.grad):
            if tensor is not None:
                local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
                total += local.numel() * local.element_size()
    for opt in optimizers:
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    local = value.to_local() if isinstance(value, DTensor) else value
                    total += local.numel() * local.element_size()
    return total


def rank_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def peak_memory_mb(device: torch.device) -> float:
    """GPU: the allocator's peak. CPU: the process's peak resident set (all of it)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
