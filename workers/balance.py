"""Load balancing: pipeline stages by measured layer cost, data shares by rank speed.

Stages. The pipeline's items are [embeddings, block 0, ..., block n-1, head + loss]; each
is timed forward + backward on one microbatch (median of a few runs; wall time on a GPU,
the process's CPU time on a CPU, where other processes share the cores), and its memory is
its parameters with their gradients and AdamW moments (4 copies) plus its output
activation per microbatch in flight. Every rank measures and the costs are averaged over
the world (one all-reduce), so every rank computes the same split. The split is
contiguous, gives every stage at least one item, and minimises the slowest stage's time;
among splits within 5% of that optimum it takes the one whose largest stage memory is
smallest. The embeddings go with the first stage and the head with the last; either may
be its stage's only item (a head as costly as two blocks is a stage on its own).

Under ZB-V (`v_shape`) a rank runs two stages, r and 2 pp - 1 - r, one after the other,
so what is balanced is each rank's sum of its two stages: the first and the last stage
(the embeddings and the head) share rank 0, which is what lets a costly head be paired
with cheap embeddings instead of bounding the pipeline alone. The same two criteria
(time, then memory within 5%) over rank sums, by a dynamic programme that takes the
stages in pairs from both ends.

Batch shares. A rank's speed is its median `local_s` per sample over a window of steps
(all-gathered, so all ranks agree); shares of the global batch are proportional to speed
(largest remainder, at least one sample each). The global batch, hence the loss and its
gradient, does not change: each rank's mean loss is weighted by its share.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from workers import splits
from workers.gpt import GPT, next_token_loss
from workers.model_configs import GPTConfig

# Slack on the slowest stage's time within which memory decides.
TIME_SLACK = 0.05


@dataclass(frozen=True)
class ItemCost:
    time_s: float
    memory_bytes: int


@dataclass(frozen=True)
class StageSplit:
    """Blocks of each stage, each stage's predicted time and memory, and the stages
    each pipeline rank runs (one, or two under interleaved 1F1B and ZB-V)."""

    layers: list[range]
    time_s: list[float]
    memory_bytes: list[int]
    ranks: list[list[int]]

    @property
    def rank_time_s(self) -> list[float]:
        """Each rank's work per microbatch: the sum of its stages'."""
        return [sum(self.time_s[s] for s in stages) for stages in self.ranks]

    @property
    def time_ratio(self) -> float:
        """Slowest over fastest rank (a rank's stages run one after the other)."""
        times = self.rank_time_s
        return max(times) / max(min(times), 1e-12)


def mirrored(ranks: Sequence[Sequence[int]]) -> bool:
    """ZB-V's placement: every rank runs a stage and its mirror, r and num_stages - 1 - r."""
    last = sum(len(stages) for stages in ranks) - 1
    return all(len(stages) == 2 and stages[0] + stages[1] == last for stages in ranks)


def equal_layers(n_layer: int, ranks: Sequence[Sequence[int]]) -> list[range]:
    """Contiguous, as even as possible, the earlier stages taking the remainder (under a
    V the middle ones, as rank 0 also runs the last stage). With fewer layers than stages
    the last stage holds only the head and, two short, the first only the embeddings."""
    num_stages = sum(len(stages) for stages in ranks)
    if n_layer < num_stages - 2:
        raise ValueError(f"{n_layer} layers cannot fill {num_stages} stages")
    holders = list(range(num_stages))[int(n_layer < num_stages - 1) :]
    holders = holders[: len(holders) - int(n_layer < num_stages)]
    base, extra = divmod(n_layer, len(holders))
    ends = (0, num_stages - 1) if mirrored(ranks) else ()
    takers = sorted(holders, key=lambda s: (s in ends, s))[:extra]
    counts = [base + (s in takers) if s in holders else 0 for s in range(num_stages)]
    bounds = [0, *itertools.accumulate(counts)]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def measure_costs(
    config: GPTConfig, *, batch: int, in_flight: int, device: torch.device, repeats: int = 3
) -> list[ItemCost]:
    """Forward + backward time and memory of [embeddings, blocks..., head + loss]."""
    torch.manual_seed(0)
    model = GPT(config).to(device)
    tokens = torch.randint(config.vocab_size, (batch, config.seq_len), device=device)
    assert model.tok_emb is not None and model.pos_emb is not None
    assert model.ln_f is not None and model.head is not None
    tok_emb, pos_emb, ln_f, head = model.tok_emb, model.pos_emb, model.ln_f, model.head
    positions = torch.arange(config.seq_len, device=device)

    def embed(_: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = tok_emb(tokens) + pos_emb(positions)
        return out

    def head_loss(x: torch.Tensor) -> torch.Tensor:
        return next_token_loss(head(ln_f(x)), tokens)

    hidden = embed(tokens).detach()
    items: list[tuple[Callable[[torch.Tensor], torch.Tensor], Sequence[nn.Module]]] = [
        (embed, [tok_emb, pos_emb])
    ]
    items += [(block, [block]) for block in model.blocks.values()]
    items.append((head_loss, [ln_f, head]))
    costs = []
    for fn, modules in items:
        params = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
        out_bytes = hidden.numel() * hidden.element_size() if fn is not head_loss else 0
        elapsed = statistics.median(_time_fwd_bwd(fn, hidden, device) for _ in range(repeats))
        costs.append(ItemCost(elapsed, 4 * params + in_flight * out_bytes))
    return costs


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


def stage_costs(
    costs: list[ItemCost], layers: list[range], ranks: Sequence[Sequence[int]]
) -> StageSplit:
    """Predicted per-stage cost of a split; items are [emb, blocks..., head]; `ranks`:
    the stages each pipeline rank runs."""
    last = len(layers) - 1
    times, memory = [], []
    for stage, blocks in enumerate(layers):
        chosen = [costs[1 + b] for b in blocks]
        if stage == 0:
            chosen.append(costs[0])
        if stage == last:
            chosen.append(costs[-1])
        times.append(sum(c.time_s for c in chosen))
        memory.append(sum(c.memory_bytes for c in chosen))
    return StageSplit(layers, times, memory, [list(stages) for stages in ranks])


def stage_items(layers: range, *, first: bool, last: bool) -> str:
    """What a stage holds, for logs: "embeddings + layers 0-1", "layers 2-3", "head only"."""
    items = ["embeddings"] if first else []
    if layers:
        items.append(f"layers {layers.start}-{layers.stop - 1}")
    if last:
        items.append("head")
    return " + ".join(items) + (" only" if len(items) == 1 and not layers else "")


def balanced_split(costs: list[ItemCost], ranks: Sequence[Sequence[int]]) -> StageSplit:
    """Contiguous split of [embeddings, blocks..., head] over the stages of `ranks`
    minimising the slowest stage's time (under ZB-V's mirrored placement, the slowest
    rank's two stages), then its largest memory. Every stage holds at least one item, so
    the first may hold the embeddings alone and the last the head alone: a head + loss
    that costs as much as two blocks is a stage's worth of work on its own."""
    num_stages = sum(len(stages) for stages in ranks)
    times = [c.time_s for c in costs]
    memory = [float(c.memory_bytes) for c in costs]
    split = splits.min_max_pairs_split if mirrored(ranks) else splits.min_max_split
    best_time = split(times, num_stages, limit=None)[0]
    if best_time == float("inf"):
        raise ValueError(f"{len(costs)} items cannot fill {num_stages} stages")
    _, cuts = split(memory, num_stages, limit=(times, best_time * (1 + TIME_SLACK)))
    # A cut before item i (block i - 1) starts the next stage at block i - 1.
    bounds = [0, *(cut - 1 for cut in cuts), len(costs) - 2]
    layers = [range(a, b) for a, b in itertools.pairwise(bounds)]
    return stage_costs(costs, layers, ranks)


def batch_shares(speeds: Sequence[float], global_batch: int) -> list[int]:
    """Split `global_batch` in proportion to `speeds` (samples per second), at least one
    sample each, rounding by largest remainder."""
    total = sum(speeds)
    ideal = [global_batch * s / total for s in speeds]
    shares = [max(1, int(x)) for x in ideal]
    while sum(shares) > global_batch:  # the floor of 1 overshot: take from the largest
        shares[shares.index(max(shares))] -= 1
    order = sorted(range(len(ideal)), key=lambda r: (shares[r] - ideal[r], r))
    for r in order[: global_batch - sum(shares)]:
        shares[r] += 1
    return shares


def share_slice(step_start: int, shares: Sequence[int], dp_rank: int) -> tuple[int, int]:
    """(first sample, count) of `dp_rank` when the ranks read `shares` of one batch."""
    return step_start + sum(shares[:dp_rank]), shares[dp_rank]
