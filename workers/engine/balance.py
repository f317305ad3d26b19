"""Load balancing: pipeline stages by measured layer cost, data shares by rank speed.

Stages. The pipeline's items are [embeddings, units...]: each block in pieces (attention,
then the MLP's hidden width in slices: `workers.engine.gpt.PIECES`), then the head in
vocabulary slices (`workers.engine.gpt.HEAD_PIECES`, the last with the loss), so a stage
boundary may fall inside a block or inside the head where whole items are too coarse
(gpt-mini's head costs 1.7 blocks: at pp = 4 no whole-block split comes within 15%; from pp = 6
the head alone is more than a stage's share). What each item costs is measured in
`workers.engine.item_costs`.

The split is contiguous and gives every stage at least one item. Throughput first: the
slowest stage as fast as it can be (it sets the pipeline's pace); then balance: among
those splits, the fastest stage as slow as it can be (the least idle time); memory is a
bound (a GPU's memory), not a goal. The embeddings go with the first stage and may be
its only item; the last stage holds at least the head's last slice.

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
from collections.abc import Sequence
from dataclasses import dataclass

from workers.engine import splits
from workers.engine.gpt import MLP_FIRST, MLP_SLICES, PIECES, head_units
from workers.engine.item_costs import ItemCost
from workers.engine.model_configs import GPTConfig

# What a finer split (blocks cut, then the head) must gain over a coarser one (slowest or
# fastest rank).
CUT_GAIN = 0.01
# Items ([embeddings, groups...]) up to which ZB-V's pair programme (O(items^4)) tries a
# level of granularity: 9 layers in pieces and a head in 4 slices. Each level is gated on
# its own count (`levels`), so a deeper model still gets the finer levels it can afford.
MAX_PAIR_ITEMS = 1 + 9 * PIECES + 4


@dataclass(frozen=True)
class StageSplit:
    """Units (block pieces, head slices) of each stage, each stage's predicted time and
    memory, and the stages
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


def stage_costs(
    costs: list[ItemCost], units: list[range], ranks: Sequence[Sequence[int]]
) -> StageSplit:
    """Predicted per-stage cost of a split; items are [embeddings, units...] (block pieces,
    then head slices); `units`: each stage's; `ranks`: the stages each pipeline rank runs."""
    times, memory = [], []
    for stage, held in enumerate(units):
        chosen = [costs[1 + u] for u in held] + ([costs[0]] if stage == 0 else [])
        times.append(sum(c.time_s for c in chosen))
        memory.append(sum(c.memory_bytes for c in chosen))
    return StageSplit(units, times, memory, [list(stages) for stages in ranks])


def stage_items(config: GPTConfig, units: range, *, first: bool) -> str:
    """What a stage holds, for logs: "embeddings + layers 0-1 + layer 2 (attention)",
    "layer 2 (MLP slices 1-3 of 4) + layers 3-4 + head slice 0 of 4", "head only"."""
    head = head_units(config)
    items = ["embeddings"] if first else []
    blocks = range(min(units.start, head.start), min(units.stop, head.start))
    start = blocks.start
    if start % PIECES and blocks:  # it begins inside a block
        start = min(blocks.stop, (start // PIECES + 1) * PIECES)
        items.append(_pieces_name(range(blocks.start, start)))
    whole = range(start, start + (blocks.stop - start) // PIECES * PIECES)
    if whole:
        first_block, last_block = whole.start // PIECES, whole.stop // PIECES - 1
        many = last_block > first_block
        items.append(f"layers {first_block}-{last_block}" if many else f"layer {first_block}")
    if whole.stop < blocks.stop:  # it ends inside a block
        items.append(_pieces_name(range(whole.stop, blocks.stop)))
    held = range(max(units.start, head.start) - head.start, max(units.stop - head.start, 0))
    if len(held) == len(head):
        items.append("head")
    elif held:
        slices = f"slices {held.start}-{held.stop - 1}" if len(held) > 1 else f"slice {held.start}"
        items.append(f"head {slices} of {len(head)}")
    alone = not units if first else units == head
    return " + ".join(items) + (" only" if alone else "")


def _pieces_name(units: range) -> str:
    """A cut block's pieces: "layer 1 (attention, MLP slices 0-1 of 4)"."""
    pieces = range(units.start % PIECES, units.start % PIECES + len(units))
    names = ["attention"] if pieces.start < MLP_FIRST else []
    first, last = max(pieces.start, MLP_FIRST) - MLP_FIRST, pieces.stop - 1 - MLP_FIRST
    if (first, last) == (0, MLP_SLICES - 1):
        names.append("MLP")
    elif last > first:
        names.append(f"MLP slices {first}-{last} of {MLP_SLICES}")
    elif last == first:
        names.append(f"MLP slice {first} of {MLP_SLICES}")
    return f"layer {units.start // PIECES} ({', '.join(names)})"


def unit_groups(config: GPTConfig, *, cut_blocks: bool, cut_head: bool) -> list[range]:
    """The units in the groups a split keeps together: a block's pieces unless
    `cut_blocks`, the head's slices unless `cut_head`."""
    blocks = [
        range(u, u + 1) if cut_blocks else range(u, u + PIECES)
        for u in range(0, config.n_layer * PIECES, 1 if cut_blocks else PIECES)
    ]
    head = head_units(config)
    return blocks + ([range(u, u + 1) for u in head] if cut_head else [head])


def balanced_split(
    costs: list[ItemCost],
    ranks: Sequence[Sequence[int]],
    config: GPTConfig,
    *,
    cut_blocks: bool = True,
    cut_head: bool = True,
    memory_budget: float | None = None,
) -> StageSplit:
    """Contiguous split of [embeddings, units...] over the stages of `ranks` with the
    slowest stage (under ZB-V's mirrored placement, the slowest rank's two stages) as fast
    as it can be, and then the fastest as slow as it can be (the least idle time at that
    throughput); no stage's memory (under ZB-V: no rank pair's) above `memory_budget`.
    The first stage may hold the embeddings alone; every other stage holds a unit at least,
    so the last may hold the head alone: a head + loss that costs as much as two blocks
    is a stage's worth of work on its own.

    A stage boundary may fall inside a block (`cut_blocks`; tensor parallel shards whole
    blocks), then also inside the head (`cut_head`), each only where that gains over the
    coarser split chosen so far (`_better`): cutting the head costs the most (the target
    ids travel, the logits are no longer one product). Under ZB-V the pair programme
    grows as items^4, so each level is tried only within MAX_PAIR_ITEMS (`levels`)."""
    coarse_to_fine = levels(config, ranks, cut_blocks=cut_blocks, cut_head=cut_head)
    chosen: StageSplit | None = None
    for groups in coarse_to_fine:
        split = _split_groups(costs, ranks, groups, memory_budget)
        if split is not None and (chosen is None or _better(split, chosen)):
            chosen = split
    if chosen is None:
        raise ValueError(_unfillable(len(coarse_to_fine[-1]), ranks, memory_budget))
    return chosen


def levels(
    config: GPTConfig, ranks: Sequence[Sequence[int]], *, cut_blocks: bool, cut_head: bool
) -> list[list[range]]:
    """The granularities `balanced_split` tries, coarse to fine, each as its groups of
    units: whole blocks and a whole head; blocks in pieces (`cut_blocks`); the head in
    slices too (`cut_head`), with blocks in pieces where that level is affordable and
    whole where it is not. Under ZB-V a level is affordable when its 1 + groups items are
    within MAX_PAIR_ITEMS; the coarsest is always tried. Why per level and not one gate on
    the finest: gpt-small's 12 layers in pieces are 65 items, beyond the gate, but whole
    blocks with the head in slices are 17, and its head (5 blocks' time) is what needs
    cutting: with one gate its head stayed whole, slowest/fastest rank 1.36 predicted at
    pp = 4 against 1.04 with the head in slices (BENCHMARKS.md)."""

    def affordable(groups: list[range]) -> bool:
        return not mirrored(ranks) or 1 + len(groups) <= MAX_PAIR_ITEMS

    chosen = [unit_groups(config, cut_blocks=False, cut_head=False)]
    pieces = unit_groups(config, cut_blocks=True, cut_head=False)
    if cut_blocks and affordable(pieces):
        chosen.append(pieces)
    if cut_head:
        finest_first = [
            unit_groups(config, cut_blocks=b, cut_head=True) for b in (cut_blocks, False)
        ]
        chosen.extend(next(([g] for g in finest_first if affordable(g)), []))
    return chosen


def _split_groups(
    costs: list[ItemCost],
    ranks: Sequence[Sequence[int]],
    groups: list[range],
    memory_budget: float | None,
) -> StageSplit | None:
    """The best split that keeps each group of units on one stage (None: none fits)."""
    items = [costs[0], *(_merged([costs[1 + u] for u in g]) for g in groups)]
    ranges = _balanced_ranges(items, ranks, memory_budget)
    if ranges is None:
        return None
    units = [
        range(groups[r.start].start, groups[r.stop - 1].stop) if r else range(0, 0) for r in ranges
    ]
    return stage_costs(costs, units, ranks)


def _unfillable(groups: int, ranks: Sequence[Sequence[int]], budget: float | None) -> str:
    num_stages = sum(len(stages) for stages in ranks)
    within = "" if budget is None else f" within {budget / 2**30:.1f} GiB each"
    return f"1 + {groups} items cannot fill {num_stages} stages{within}"


def _better(finer: StageSplit, coarser: StageSplit) -> bool:
    """Whether a finer cut (inside blocks, inside the head) gains more than CUT_GAIN over
    a coarser one on what the programme balanced (a rank's pair under ZB-V, else each
    stage): a smaller gain is within the timings' noise, and a cut adds stage boundaries
    (a ZB-V split of gpt-mini at pp = 4 cut layer 0 into three one-piece stages for the
    same predicted times)."""
    loads, coarser_loads = _balanced_loads(finer), _balanced_loads(coarser)
    slowest, coarser_slowest = max(loads), max(coarser_loads)
    if slowest < coarser_slowest * (1 - CUT_GAIN):
        return True
    no_slower = slowest <= coarser_slowest * (1 + 1e-9)
    return no_slower and min(loads) > min(coarser_loads) * (1 + CUT_GAIN)


def _balanced_loads(split: StageSplit) -> list[float]:
    return split.rank_time_s if mirrored(split.ranks) else split.time_s


def _merged(costs: Sequence[ItemCost]) -> ItemCost:
    return ItemCost(sum(c.time_s for c in costs), sum(c.memory_bytes for c in costs))


def _balanced_ranges(
    costs: list[ItemCost], ranks: Sequence[Sequence[int]], memory_budget: float | None
) -> list[range] | None:
    """The split of [embeddings, items...] as each stage's range of items (after the
    embeddings): the least slowest time (stage, or ZB-V rank pair), then the most fastest
    time; None when no split fills the stages within the memory bound."""
    num_stages = sum(len(stages) for stages in ranks)
    times = [c.time_s for c in costs]
    limits = (
        [] if memory_budget is None else [([float(c.memory_bytes) for c in costs], memory_budget)]
    )
    split = splits.min_max_pairs_split if mirrored(ranks) else splits.min_max_split
    slowest, _ = split(times, num_stages, limits=limits)
    if slowest == float("inf"):
        return None
    _, cuts = split([-t for t in times], num_stages, limits=[*limits, (times, slowest)])
    # A cut before item i (i >= 1) starts the next stage at item i - 1 after the embeddings.
    bounds = [0, *(cut - 1 for cut in cuts), len(costs) - 1]
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
