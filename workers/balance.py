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
    each pipeline rank runs (one each, or a V's two)."""

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


def placement(num_stages: int, *, v_shape: bool) -> list[list[int]]:
    """Stages per pipeline rank: one each, or ZB-V's pairs (r, num_stages - 1 - r)."""
    if v_shape:
        return [[r, num_stages - 1 - r] for r in range(num_stages // 2)]
    return [[s] for s in range(num_stages)]


def equal_layers(num_stages: int, n_layer: int) -> list[range]:
    """Contiguous, as even as possible, the earlier stages taking the remainder. With
    fewer layers than stages the first stage holds only the embeddings and the last only
    the head (needs n_layer >= num_stages - 2, which the plan checks)."""
    if n_layer < num_stages:
        middle = equal_layers(num_stages - 2, n_layer)
        return [range(0, 0), *middle, range(n_layer, n_layer)]
    base, extra = divmod(n_layer, num_stages)
    starts = [s * base + min(s, extra) for s in range(num_stages)]
    return [range(start, start + base + (1 if s < extra else 0)) for s, start in enumerate(starts)]


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


def stage_costs(costs: list[ItemCost], layers: list[range], *, v_shape: bool = False) -> StageSplit:
    """Predicted per-stage cost of a split; items are [emb, blocks..., head]."""
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
    return StageSplit(layers, times, memory, placement(len(layers), v_shape=v_shape))


def stage_items(layers: range, *, first: bool, last: bool) -> str:
    """What a stage holds, for logs: "embeddings + layers 0-1", "layers 2-3", "head only"."""
    items = ["embeddings"] if first else []
    if layers:
        items.append(f"layers {layers.start}-{layers.stop - 1}")
    if last:
        items.append("head")
    return " + ".join(items) + (" only" if len(items) == 1 and not layers else "")


def balanced_split(costs: list[ItemCost], num_stages: int, *, v_shape: bool = False) -> StageSplit:
    """Contiguous split of [embeddings, blocks..., head] minimising the slowest stage's
    time (under `v_shape`, the slowest rank's two stages), then its largest memory. Every
    stage holds at least one item, so the first may hold the embeddings alone and the
    last the head alone: a head + loss that costs as much as two blocks is a stage's
    worth of work on its own."""
    times = [c.time_s for c in costs]
    memory = [float(c.memory_bytes) for c in costs]
    split = _min_max_v_split if v_shape else _min_max_split
    best_time = split(times, num_stages, limit=None)[0]
    _, cuts = split(memory, num_stages, limit=(times, best_time * (1 + TIME_SLACK)))
    # A cut before item i (block i - 1) starts the next stage at block i - 1.
    bounds = [0, *(cut - 1 for cut in cuts), len(costs) - 2]
    layers = [range(a, b) for a, b in itertools.pairwise(bounds)]
    return stage_costs(costs, layers, v_shape=v_shape)


def _min_max_split(
    values: list[float],
    parts: int,
    *,
    limit: tuple[list[float], float] | None,
) -> tuple[float, list[int]]:
    """Dynamic programme over contiguous splits of `values` into `parts` non-empty
    groups: the smallest possible largest group sum, and the cut points. With `limit`
    = (times, bound), groups whose time sum exceeds the bound are not allowed."""
    n = len(values)
    prefix = _prefix(values)
    time_prefix = _prefix(limit[0]) if limit is not None else prefix
    inf = float("inf")
    # best[k][i]: the first i values in k groups.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                if best[k - 1][j] == inf:
                    continue
                if limit is not None and time_prefix[i] - time_prefix[j] > limit[1] + 1e-12:
                    continue
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    cuts, i = [], n
    for k in range(parts, 1, -1):
        i = cut[k][i]
        cuts.append(i)
    return best[parts][n], sorted(cuts)


def _min_max_v_split(
    values: list[float],
    parts: int,
    *,
    limit: tuple[list[float], float] | None,
) -> tuple[float, list[int]]:
    """As `_min_max_split`, but a group's cost is the sum of the pair of stages one rank
    runs under ZB-V: stage r with stage parts - 1 - r. The pairs are chosen from both ends
    inwards: state (i, j) = the front stages cover values[:i] and the back ones values[j:];
    the innermost pair must meet (i == j). O(parts * n^4) at worst, for n items."""
    n, pairs = len(values), parts // 2
    prefix = _prefix(values)
    time_prefix = _prefix(limit[0]) if limit is not None else prefix
    bound = limit[1] + 1e-12 if limit is not None else float("inf")
    # layer[(i, j)] = (the largest pair sum so far, the state it came from)
    layers: list[dict[tuple[int, int], tuple[float, tuple[int, int]]]] = [{(0, n): (0.0, (0, n))}]
    for r in range(pairs):
        after = 2 * (pairs - r - 1)  # items the pairs still to come need at least
        nxt: dict[tuple[int, int], tuple[float, tuple[int, int]]] = {}
        for (i, j), (cost, _) in layers[-1].items():
            for i2 in range(i + 1, j):
                for j2 in range(i2 + after, j) if after else (i2,):
                    if time_prefix[i2] - time_prefix[i] + time_prefix[j] - time_prefix[j2] > bound:
                        continue
                    load = max(cost, prefix[i2] - prefix[i] + prefix[j] - prefix[j2])
                    if load < nxt.get((i2, j2), (float("inf"),))[0]:
                        nxt[(i2, j2)] = (load, (i, j))
        layers.append(nxt)
    if not layers[-1]:
        return float("inf"), []
    state = min(layers[-1], key=lambda key: layers[-1][key][0])
    best = layers[-1][state][0]
    fronts, backs = [], []
    for layer in reversed(layers[1:]):
        fronts.append(state[0])
        backs.append(state[1])
        state = layer[state][1]
    # fronts[0] == backs[0] is the middle cut, counted once.
    return best, sorted({*fronts, *backs[1:]})


def _prefix(values: Sequence[float]) -> list[float]:
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    return prefix


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
