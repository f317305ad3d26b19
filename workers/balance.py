"""Load balancing: pipeline stages by measured layer cost, data shares by rank speed.

Stages. The pipeline's items are [embeddings, block pieces, head + loss], a block in three
pieces (attention, MLP in, MLP out: `workers.gpt.PIECES`), so a stage boundary may fall
inside a block where whole blocks are too coarse (gpt-mini's head costs 1.7 blocks: at
pp = 4 no whole-block split comes within 15%). Each item is timed forward + backward on
one microbatch (median of a few runs; wall time on a GPU, the process's CPU time on a
CPU, where other processes share the cores); its memory is its parameters with their
gradients and AdamW moments (4 copies) plus its output activation per microbatch in
flight (5x wider after MLP in). Every rank measures and the costs are averaged over the
world (one all-reduce), so every rank computes the same split.

The split is contiguous and gives every stage at least one item. Throughput first: the
slowest stage as fast as it can be (it sets the pipeline's pace); then balance: among
those splits, the fastest stage as slow as it can be (the least idle time); memory is a
bound (a GPU's memory), not a goal. The embeddings go with the first stage and the head
with the last; either may be its stage's only item.

Under ZB-V (`v_shape`) a rank runs two stages, r and 2 pp - 1 - r, one after the other,
so what is balanced is each rank's sum of its two stages: the first and the last stage
(the embeddings and the head) share rank 0, which is what lets a costly head be paired
with cheap embeddings instead of bounding the pipeline alone. The same criteria over
rank sums, by a dynamic programme that takes the stages in pairs from both ends.

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
from workers.gpt import (
    GPT,
    PIECE_NAMES,
    PIECES,
    Block,
    block_units,
    boundary_width,
    next_token_loss,
)
from workers.model_configs import GPTConfig

# What a split that cuts blocks must gain over whole blocks (slowest or fastest rank).
CUT_GAIN = 0.01
# Timing runs per repeat: as many as the blocks one measurement stands for, up to this.
MAX_ROUNDS_PER_REPEAT = 6
# Items up to which ZB-V's pair programme (O(items^4)) also tries block pieces: 14 layers.
MAX_PAIR_ITEMS = 2 + 14 * PIECES


@dataclass(frozen=True)
class ItemCost:
    time_s: float
    memory_bytes: int


@dataclass(frozen=True)
class StageSplit:
    """Block pieces of each stage, each stage's predicted time and memory, and the stages
    each pipeline rank runs (one, or two under interleaved 1F1B and ZB-V)."""

    units: list[range]
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
    config: GPTConfig,
    *,
    batch: int,
    in_flight: int,
    device: torch.device,
    repeats: int = 3,
    param_shards: int = 1,
) -> list[ItemCost]:
    """Forward + backward time and memory of [embeddings, block pieces..., head + loss]
    (each block's pieces in order: attention, MLP in, MLP out; `workers.gpt.PIECES`).

    The blocks are alike, so one block's pieces are timed and stand for every block: the
    medians come from repeats x n_layer runs each (at most repeats x 6), and the runs go
    round the items in turn, so a change in the machine's load falls on all of them
    alike (timing each of gpt-mini's 18 pieces on its own gave the same piece 22-41 ms
    on a shared CPU)."""
    torch.manual_seed(0)
    model = GPT(config)
    model.keep_only(range(0, 0), first=True, last=True)  # the ends; the pieces come below
    model.to(device)
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

    pieces = []
    for p in range(PIECES):
        piece = Block(config).to(device)
        piece.cut(range(p, p + 1))
        pieces.append(piece)
    # (what runs, its modules, the unit its input enters, the unit its output enters)
    kinds: list[tuple[Callable[[torch.Tensor], torch.Tensor], Sequence[nn.Module], int, int]] = [
        (embed, [tok_emb, pos_emb], 0, 0),
        *((piece, [piece], p, p + 1) for p, piece in enumerate(pieces)),
        (head_loss, [ln_f, head], 0, -1),
    ]
    inputs = [
        torch.randn(batch, config.seq_len, boundary_width(config, k[2]), device=device)
        for k in kinds
    ]
    runs: list[list[float]] = [[] for _ in kinds]
    for _ in range(repeats * min(max(config.n_layer, 1), MAX_ROUNDS_PER_REPEAT)):
        for k, (fn, _modules, _in, _out) in enumerate(kinds):
            runs[k].append(_time_fwd_bwd(fn, inputs[k], device))
    measured = []
    for (_fn, modules, _in, out_unit), times in zip(kinds, runs, strict=True):
        params = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
        params //= param_shards  # FSDP over dp holds 1/dp of them, their grads and moments
        out_bytes = 0 if out_unit < 0 else _hidden_bytes(config, batch, out_unit)
        measured.append(ItemCost(statistics.median(times), 4 * params + in_flight * out_bytes))
    embeddings, *block, head_cost = measured
    return [embeddings, *block * config.n_layer, head_cost]


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


def stage_costs(
    costs: list[ItemCost], units: list[range], ranks: Sequence[Sequence[int]]
) -> StageSplit:
    """Predicted per-stage cost of a split; items are [emb, block pieces..., head];
    `units`: each stage's block pieces; `ranks`: the stages each pipeline rank runs."""
    last = len(units) - 1
    times, memory = [], []
    for stage, pieces in enumerate(units):
        chosen = [costs[1 + u] for u in pieces]
        if stage == 0:
            chosen.append(costs[0])
        if stage == last:
            chosen.append(costs[-1])
        times.append(sum(c.time_s for c in chosen))
        memory.append(sum(c.memory_bytes for c in chosen))
    return StageSplit(units, times, memory, [list(stages) for stages in ranks])


def stage_items(units: range, *, first: bool, last: bool) -> str:
    """What a stage holds, for logs: "embeddings + layers 0-1 + layer 2 (attention)",
    "layer 2 (MLP in, MLP out) + layers 3-4", "head only"."""
    items = ["embeddings"] if first else []
    start = units.start
    if start % PIECES and units:  # it begins inside a block
        start = min(units.stop, (start // PIECES + 1) * PIECES)
        items.append(_pieces_name(range(units.start, start)))
    whole = range(start, start + (units.stop - start) // PIECES * PIECES)
    if whole:
        first_block, last_block = whole.start // PIECES, whole.stop // PIECES - 1
        many = last_block > first_block
        items.append(f"layers {first_block}-{last_block}" if many else f"layer {first_block}")
    if whole.stop < units.stop:  # it ends inside a block
        items.append(_pieces_name(range(whole.stop, units.stop)))
    if last:
        items.append("head")
    return " + ".join(items) + (" only" if len(items) == 1 and not units else "")


def _pieces_name(units: range) -> str:
    names = ", ".join(PIECE_NAMES[u % PIECES] for u in units)
    return f"layer {units.start // PIECES} ({names})"


def balanced_split(
    costs: list[ItemCost],
    ranks: Sequence[Sequence[int]],
    *,
    cut_blocks: bool = True,
    memory_budget: float | None = None,
) -> StageSplit:
    """Contiguous split of [embeddings, block pieces..., head] over the stages of `ranks`
    with the slowest stage (under ZB-V's mirrored placement, the slowest rank's two
    stages) as fast as it can be, and then the fastest as slow as it can be (the least
    idle time at that throughput); no stage's memory (under ZB-V: no rank pair's) above
    `memory_budget`. Every stage
    holds at least one item, so the first may hold the embeddings alone and the last the
    head alone: a head + loss that costs as much as two blocks is a stage's worth of work
    on its own.

    A stage boundary may fall inside a block (at its pieces) where that gains over whole
    blocks (`_better`), unless `cut_blocks` is off (tensor parallel shards whole
    blocks). Under ZB-V the pair programme grows as
    items^4, so beyond MAX_PAIR_ITEMS items it cuts at whole blocks only."""
    pieces = range(1, len(costs) - 1, PIECES)
    blocks = [costs[0], *(_merged(costs[i : i + PIECES]) for i in pieces), costs[-1]]
    if not cut_blocks or (mirrored(ranks) and len(costs) > MAX_PAIR_ITEMS):
        whole_ranges = _balanced_ranges(blocks, ranks, memory_budget)
        return stage_costs(costs, [block_units(r) for r in whole_ranges], ranks)
    cut = stage_costs(costs, _balanced_ranges(costs, ranks, memory_budget), ranks)
    try:
        whole_ranges = _balanced_ranges(blocks, ranks, memory_budget)
    except ValueError:  # no whole-block split keeps the memory bound or fills the stages
        return cut
    whole = stage_costs(costs, [block_units(r) for r in whole_ranges], ranks)
    return cut if _better(cut, whole) else whole


def _better(cut: StageSplit, whole: StageSplit) -> bool:
    """Whether cutting blocks gains more than CUT_GAIN on what the programme balanced
    (a rank's pair under ZB-V, else each stage): a smaller gain is within the timings'
    noise, and a cut adds stage boundaries (a ZB-V split of gpt-mini at pp = 4 cut layer
    0 into three one-piece stages for the same predicted times)."""
    loads, whole_loads = _balanced_loads(cut), _balanced_loads(whole)
    slowest, whole_slowest = max(loads), max(whole_loads)
    if slowest < whole_slowest * (1 - CUT_GAIN):
        return True
    no_slower = slowest <= whole_slowest * (1 + 1e-9)
    return no_slower and min(loads) > min(whole_loads) * (1 + CUT_GAIN)


def _balanced_loads(split: StageSplit) -> list[float]:
    return split.rank_time_s if mirrored(split.ranks) else split.time_s


def _merged(costs: Sequence[ItemCost]) -> ItemCost:
    return ItemCost(sum(c.time_s for c in costs), sum(c.memory_bytes for c in costs))


def _balanced_ranges(
    costs: list[ItemCost], ranks: Sequence[Sequence[int]], memory_budget: float | None
) -> list[range]:
    """The split of [first, middle items..., last] as each stage's range of middle items:
    the least slowest time (stage, or ZB-V rank pair), then the most fastest time."""
    num_stages = sum(len(stages) for stages in ranks)
    times = [c.time_s for c in costs]
    limits = (
        [] if memory_budget is None else [([float(c.memory_bytes) for c in costs], memory_budget)]
    )
    split = splits.min_max_pairs_split if mirrored(ranks) else splits.min_max_split
    slowest, _ = split(times, num_stages, limits=limits)
    if slowest == float("inf"):
        within = "" if memory_budget is None else f" within {memory_budget / 2**30:.1f} GiB each"
        raise ValueError(f"{len(costs)} items cannot fill {num_stages} stages{within}")
    _, cuts = split([-t for t in times], num_stages, limits=[*limits, (times, slowest)])
    # A cut before item i (middle item i - 1) starts the next stage at middle item i - 1.
    bounds = [0, *(cut - 1 for cut in cuts), len(costs) - 2]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


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
