"""What each pipeline item costs, for the stage balancer (`workers.engine.balance`).

The items are [embeddings, block pieces..., head slices...]. Each is timed forward +
backward on one microbatch (the fastest of many runs: interference only ever adds time;
on this machine one stage's runs spread 146-235 ms of CPU time at load 0.5, while the
fastest of 20 agreed within 1.5% between two copies of it, their medians 4% apart; wall
time on a GPU, the process's CPU time on a CPU, where other processes share the cores);
its memory is its parameters with their gradients and AdamW moments (4 copies) plus its
output activation per microbatch in flight (2x wider inside the MLP). Every rank measures
and the costs are averaged over the world (one all-reduce), so every rank computes the
same split.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from workers.engine.gpt import GPT, HEAD_STATS, PIECES, Block, boundary_width, head_units
from workers.engine.model_configs import GPTConfig

# Timing runs per repeat: as many as the blocks one measurement stands for, up to this.
MAX_ROUNDS_PER_REPEAT = 6


@dataclass(frozen=True)
class ItemCost:
    time_s: float
    memory_bytes: int


def measure_costs(
    config: GPTConfig,
    *,
    batch: int,
    in_flight: int,
    device: torch.device,
    repeats: int = 3,
    param_shards: int = 1,
) -> list[ItemCost]:
    """Forward + backward time and memory of [embeddings, block pieces..., head slices...]
    (each block's pieces in order: attention, the MLP's slices; `workers.engine.gpt.PIECES`; the
    head's first slice with the final norm, its last with the loss).

    The blocks are alike, so one block's pieces are timed and stand for every block: the
    fastest of repeats x n_layer runs each (at most repeats x 6) is kept, and the runs go
    round the items in turn, so a change in the machine's load falls on all of them
    alike (timing each of gpt-mini's 18 pieces (then 3 a block) alone gave one 22-41 ms
    on a shared CPU)."""
    torch.manual_seed(0)
    ends = GPT(config)
    head = head_units(config)
    ends.keep_only(head, first=True)  # the embeddings and the head; the pieces come below
    ends.to(device)
    tokens = torch.randint(config.vocab_size, (batch, config.seq_len), device=device)
    assert ends.tok_emb is not None and ends.pos_emb is not None
    tok_emb, pos_emb = ends.tok_emb, ends.pos_emb
    positions = torch.arange(config.seq_len, device=device)

    def embed(_: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = tok_emb(tokens) + pos_emb(positions)
        return out

    # (what runs, its modules, the unit its input enters, the unit its output enters)
    kinds: list[tuple[Callable[[torch.Tensor], torch.Tensor], Sequence[nn.Module], int, int]] = [
        (embed, [tok_emb, pos_emb], 0, 0)
    ]
    for p in range(PIECES):
        piece = Block(config).to(device)
        piece.cut(range(p, p + 1))
        kinds.append((piece, [piece], p, p + 1))
    for unit in head:
        part = _head_slice(ends, unit, tokens)
        kinds.append((part, [part.model], unit, unit + 1 if unit + 1 < head.stop else -1))
    inputs = [unit_input(config, batch, k[2], device) for k in kinds]
    runs: list[list[float]] = [[] for _ in kinds]
    for _ in range(repeats * min(max(config.n_layer, 1), MAX_ROUNDS_PER_REPEAT)):
        for k, (fn, _modules, _in, _out) in enumerate(kinds):
            runs[k].append(_time_fwd_bwd(fn, inputs[k], device))
    measured = []
    for (_fn, modules, _in, out_unit), times in zip(kinds, runs, strict=True):
        params = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
        params //= param_shards  # FSDP over dp holds 1/dp of them, their grads and moments
        out_bytes = 0 if out_unit < 0 else _hidden_bytes(config, batch, out_unit)
        measured.append(ItemCost(min(times), 4 * params + in_flight * out_bytes))
    embeddings, *rest = measured
    block, slices = rest[:PIECES], rest[PIECES:]
    return [embeddings, *block * config.n_layer, *slices]


class _HeadSlice:
    """One head slice run as a stage holding only it: its part of the running loss."""

    def __init__(self, model: GPT, tokens: torch.Tensor) -> None:
        self.model, self.tokens = model, tokens

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x, self.tokens)
        part: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return part


def _head_slice(ends: GPT, unit: int, tokens: torch.Tensor) -> _HeadSlice:
    model = copy.deepcopy(ends)
    model.keep_only(range(unit, unit + 1), first=False)
    return _HeadSlice(model, tokens)


def unit_input(config: GPTConfig, batch: int, unit: int, device: torch.device) -> torch.Tensor:
    """A stand-in for what a stage starting at `unit` receives; inside the head, a
    running log-sum-exp that is valid (max 0, sum 1, target logit 0)."""
    width = boundary_width(config, unit)
    if unit <= head_units(config).start:
        return torch.randn(batch, config.seq_len, width, device=device)
    hidden = torch.randn(batch, config.seq_len, width - HEAD_STATS, device=device)
    stats = torch.zeros(batch, config.seq_len, HEAD_STATS, device=device)
    stats[..., 1] = 1.0
    return torch.cat([hidden, stats], dim=-1)


def _hidden_bytes(config: GPTConfig, batch: int, unit: int) -> int:
    """Bytes of the activation a stage starting at `unit` receives (fp32)."""
    return batch * config.seq_len * boundary_width(config, unit) * 4


def _time_fwd_bwd(
    fn: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, device: torch.device
) -> float:
    x = hidden.clone().requires_grad_(True)
    clock = cost_clock(device)
    _sync(device)
    began = clock()
    out = fn(x)
    out.backward(torch.ones_like(out))  # type: ignore[no-untyped-call]
    _sync(device)
    return clock() - began


def cost_clock(device: torch.device) -> Callable[[], float]:
    """Wall time on a GPU (after a synchronize); CPU time of this process on a CPU,
    which other processes sharing the cores do not inflate."""
    return time.perf_counter if device.type == "cuda" else time.process_time


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def averaged(costs: list[ItemCost]) -> list[ItemCost]:
    """The world's mean time per item (so every rank splits alike); memory is computed,
    the same everywhere."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return costs
    times = torch.tensor([c.time_s for c in costs], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        times = times.cuda()
    dist.all_reduce(times)
    world = dist.get_world_size()
    return [ItemCost(float(t) / world, c.memory_bytes) for t, c in zip(times, costs, strict=True)]
