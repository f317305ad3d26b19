"""Stage splits and batch shares (pure arithmetic)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.engine.balance import (
    CUT_GAIN,
    MAX_PAIR_ITEMS,
    StageSplit,
    balanced_split,
    batch_shares,
    equal_layers,
    levels,
    share_slice,
    stage_costs,
    stage_items,
)
from workers.engine.gpt import PIECES, splits_head
from workers.engine.item_costs import ItemCost
from workers.engine.model_configs import MODEL_CONFIGS, GPTConfig
from workers.engine.stage_plan import equal_units


def config(n_layer: int, head_slices: int = 4) -> GPTConfig:
    """A model shape for the split's arithmetic: `n_layer` blocks, the head in
    `head_slices` vocabulary slices (one per vocabulary entry below 4)."""
    return GPTConfig(vocab_size=head_slices, seq_len=8, n_layer=n_layer, n_head=1, n_embd=8)


MINI = config(6)  # gpt-mini's 6 blocks and a head in 4 slices


def costs(times: list[float], memory: list[int] | None = None) -> list[ItemCost]:
    memory = memory or [1] * len(times)
    return [ItemCost(t, m) for t, m in zip(times, memory, strict=True)]


def gpt_items(embeddings: float, blocks: list[float], head: float) -> list[ItemCost]:
    """[embeddings, each block's attention and 4 MLP slices, the head's 4 slices]: a block
    40/15/15/15/15, the head in equal slices."""
    pieces = [b * share for b in blocks for share in (0.4, 0.15, 0.15, 0.15, 0.15)]
    return costs([embeddings, *pieces, *[head / 4] * 4])


def one_each(stages: int) -> list[list[int]]:
    """A stage per pipeline rank (GPipe, 1F1B)."""
    return [[s] for s in range(stages)]


def v_shape(stages: int) -> list[list[int]]:
    """ZB-V: rank r runs stages r and stages - 1 - r."""
    return [[r, stages - 1 - r] for r in range(stages // 2)]


def rank_times(times: list[float], cuts: tuple[int, ...], ranks: list[list[int]]) -> list[float]:
    """Each rank's time when `cuts` split the items (brute force's side)."""
    bounds = [0, *cuts, len(times)]
    stage = [sum(times[a:b]) for a, b in itertools.pairwise(bounds)]
    return [sum(stage[s] for s in stages) for stages in ranks]


def best_by_brute_force(times: list[float], ranks: list[list[int]]) -> tuple[float, float]:
    """The least slowest rank time over every contiguous split, then the most fastest."""
    stages = sum(len(r) for r in ranks)
    found = [
        rank_times(times, cuts, ranks)
        for cuts in itertools.combinations(range(1, len(times)), stages - 1)
    ]
    slowest = min(max(f) for f in found)
    fastest = max(min(f) for f in found if max(f) <= slowest + 1e-9)
    return slowest, fastest


def tiles(split: StageSplit, shape: GPTConfig) -> bool:
    """Every unit on exactly one stage, in order."""
    units = PIECES * shape.n_layer + shape.vocab_size
    return [u for r in split.units for u in r] == list(range(units))


def whole(split: StageSplit, shape: GPTConfig) -> bool:
    """No stage boundary inside a block or inside the head."""
    return all(r.stop % PIECES == 0 and r.stop <= PIECES * shape.n_layer for r in split.units[:-1])


def assert_best_or_within_the_gain(split: StageSplit, slowest: float, fastest: float) -> None:
    """The best split (brute force's slowest, then fastest), or a coarser one (whole
    blocks, a whole head) where the best gains no more than CUT_GAIN over it."""
    got_slowest, got_fastest = max(split.rank_time_s), min(split.rank_time_s)
    if got_slowest == pytest.approx(slowest) and got_fastest == pytest.approx(fastest):
        return
    assert slowest >= got_slowest * (1 - CUT_GAIN) - 1e-9
    assert fastest <= got_fastest * (1 + CUT_GAIN) + 1e-9


def drawn_items(
    data: st.DataObject, n_layer: int, head_slices: int
) -> tuple[GPTConfig, list[float]]:
    """A model shape and random times for its [embeddings, units...]."""
    size = 1 + PIECES * n_layer + head_slices
    times = data.draw(st.lists(st.floats(0.01, 10), min_size=size, max_size=size))
    return config(n_layer, head_slices), times


def assert_the_best_split(shape: GPTConfig, times: list[float], ranks: list[list[int]]) -> None:
    split = balanced_split(costs(times), ranks, shape)
    assert tiles(split, shape)
    assert_best_or_within_the_gain(split, *best_by_brute_force(times, ranks))


def test_a_heavy_head_gets_fewer_blocks_than_an_equal_split() -> None:
    items = gpt_items(0.1, [1] * 6, 1.7)
    equal = stage_costs(items, equal_units(MINI, one_each(2)), one_each(2))
    split = balanced_split(items, one_each(2), MINI)
    assert [(r.start, r.stop) for r in split.units] == [(0, 19), (19, 34)]  # cut in layer 3
    assert split.time_ratio < 1.03 and equal.time_ratio > 1.5


def test_a_head_as_costly_as_two_blocks_takes_part_of_the_last_block() -> None:
    items = gpt_items(0.1, [1] * 6, 1.7)  # gpt-mini's shape at pp = 4
    whole = balanced_split(items, one_each(4), MINI, cut_blocks=False, cut_head=False)  # TP
    assert [(r.start, r.stop) for r in whole.units] == [(0, 10), (10, 20), (20, 30), (30, 34)]
    assert whole.time_s == pytest.approx([2.1, 2, 2, 1.7])  # 1.24: no whole-block split is better
    split = balanced_split(items, one_each(4), MINI)
    assert split.units[-1] == range(28, 34)  # half of layer 5's MLP joins the head
    assert max(split.time_s) == pytest.approx(2.0)
    assert split.time_ratio < 1.09
    assert stage_items(MINI, split.units[-1], first=False) == (
        "layer 5 (MLP slices 2-3 of 4) + head"
    )


def test_a_head_costlier_than_a_stage_is_split_over_the_last_stages() -> None:
    items = gpt_items(0.1, [1] * 6, 1.7)  # gpt-mini's shape at pp = 6: 1.3 a stage
    head_whole = balanced_split(items, one_each(6), MINI, cut_head=False)
    assert head_whole.units[-1] == range(30, 34) and max(head_whole.time_s) == pytest.approx(1.7)
    split = balanced_split(items, one_each(6), MINI)
    assert splits_head(MINI, split.units) and tiles(split, MINI)
    assert max(split.time_s) == pytest.approx(1.425) and split.time_ratio < 1.3
    assert [stage_items(MINI, r, first=False) for r in split.units[-2:]] == [
        "layer 5 + head slice 0 of 4",
        "head slices 1-3 of 4",
    ]


def test_the_head_is_cut_only_for_a_gain_over_cut_blocks() -> None:
    """Cutting blocks gains over whole ones here; cutting the head too would take the
    slowest stage from 21.9 to 21.7, under CUT_GAIN: the head stays whole."""
    shape = config(2)
    times = [5.8, 1.2, 2.3, 2.4, 5.7, 3.5, 4.2, 7.0, 1.3, 0.7, 2.5, 6.0, 2.5, 8.4, 5.0]
    items = costs(times)
    assert best_by_brute_force(times, one_each(3))[0] == pytest.approx(21.7)
    split = balanced_split(items, one_each(3), shape)
    assert split.units == [range(0, 4), range(4, 10), range(10, 14)]  # layer 0 cut, head whole
    assert max(split.time_s) == pytest.approx(21.9)
    assert not splits_head(shape, split.units)


def test_a_stage_names_its_whole_layers_its_pieces_and_its_head_slices() -> None:
    assert stage_items(MINI, range(0, 8), first=True) == (
        "embeddings + layer 0 + layer 1 (attention, MLP slices 0-1 of 4)"
    )
    assert stage_items(MINI, range(8, 20), first=False) == (
        "layer 1 (MLP slices 2-3 of 4) + layers 2-3"
    )
    assert stage_items(MINI, range(30, 34), first=False) == "head only"
    assert stage_items(MINI, range(29, 34), first=False) == "layer 5 (MLP slice 3 of 4) + head"
    assert stage_items(MINI, range(0, 0), first=True) == "embeddings only"
    assert stage_items(MINI, range(6, 7), first=False) == "layer 1 (MLP slice 0 of 4)"
    assert stage_items(MINI, range(11, 15), first=False) == "layer 2 (MLP)"
    assert stage_items(MINI, range(25, 31), first=False) == "layer 5 + head slice 0 of 4"
    assert stage_items(MINI, range(31, 34), first=False) == "head slices 1-3 of 4"


def test_memory_is_a_bound_the_split_keeps() -> None:
    # Equal times; layer 1's last MLP slice is heavy in memory: the even split puts 14 on
    # stage 1.
    shape = config(2, head_slices=1)
    items = costs([0, *[1] * 10, 0], [0, *[1] * 9, 10, 0])
    even = balanced_split(items, one_each(2), shape)
    assert (even.time_s, even.memory_bytes) == ([5, 5], [5, 14])
    bounded = balanced_split(items, one_each(2), shape, memory_budget=13)
    assert (bounded.time_s, bounded.memory_bytes) == ([6, 4], [6, 13])  # time pays for it
    with pytest.raises(ValueError, match="within"):
        balanced_split(items, one_each(2), shape, memory_budget=9)


@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_the_split_is_the_fastest_then_the_most_even(
    n_layer: int, head_slices: int, data: st.DataObject
) -> None:
    """Against brute force: every contiguous split of the items into one stage per rank."""
    shape, times = drawn_items(data, n_layer, head_slices)
    assert_the_best_split(shape, times, one_each(data.draw(st.integers(1, min(5, len(times))))))


def test_zbv_pairs_the_head_with_the_embeddings_on_one_rank() -> None:
    items = gpt_items(0.1, [1] * 6, 1.7)  # gpt-mini's shape at pp = 2 under ZB-V
    split = balanced_split(items, v_shape(4), MINI)
    assert split.ranks == [[0, 3], [1, 2]]
    assert max(split.rank_time_s) <= 3.9 + 0.15  # the total 7.8 over two ranks
    assert split.time_ratio < 1.06
    kept = balanced_split(items, v_shape(4), MINI, cut_blocks=False, cut_head=False)
    assert whole(kept, MINI) and tiles(kept, MINI)


SMALL = MODEL_CONFIGS["gpt-small"]  # 12 blocks, a 50k vocabulary's head in 4 slices


def small_items() -> list[ItemCost]:
    """gpt-small's item costs in ms as `bench/engine_balance.py stages --model gpt-small
    --batch 1` measured them (2026-12-05): embeddings 62, a block's attention 177 and MLP
    slices 53, 53, 54, 49, the head's slices 521, 501, 504, 502 (the head ~5 blocks)."""
    block = [177.0, 53.0, 53.0, 54.0, 49.0]
    return costs([62.0, *block * SMALL.n_layer, 521.0, 501.0, 504.0, 502.0])


def test_zbv_cuts_gpt_smalls_head_though_its_blocks_in_pieces_are_too_many_items() -> None:
    """65 items in pieces are beyond the pair programme's gate, 17 with whole blocks and
    the head in slices are not: the head goes to four stages, one per rank, where whole it
    was rank 0's alone (2,090 of a 1,680 share: 1.36)."""
    ranks = v_shape(8)  # pp = 4
    assert 1 + PIECES * SMALL.n_layer + 4 > MAX_PAIR_ITEMS
    split = balanced_split(small_items(), ranks, SMALL)
    assert [(r.start, r.stop) for r in split.units] == [
        (0, 15), (15, 30), (30, 45), (45, 50), (50, 61), (61, 62), (62, 63), (63, 64)
    ]  # fmt: skip
    assert [stage_items(SMALL, r, first=False) for r in split.units[4:]] == [
        "layers 10-11 + head slice 0 of 4",
        "head slice 1 of 4",
        "head slice 2 of 4",
        "head slice 3 of 4",
    ]
    assert split.rank_time_s == pytest.approx([1722, 1662, 1659, 1679])
    whole_head = balanced_split(small_items(), ranks, SMALL, cut_head=False)
    assert whole_head.units[-1] == range(60, 64) and whole_head.time_ratio > 1.35


def test_each_level_is_gated_on_its_own_item_count() -> None:
    """Under ZB-V gpt-small tries whole blocks, then whole blocks with the head in slices;
    one stage per rank, or gpt-mini's 6 layers, every level with blocks in pieces."""
    counts = {
        (name, v): [
            len(g) for g in levels(MODEL_CONFIGS[name], ranks, cut_blocks=True, cut_head=True)
        ]
        for name in ("gpt-small", "gpt-mini")
        for v, ranks in ((True, v_shape(8)), (False, one_each(4)))
    }
    assert counts == {
        ("gpt-small", True): [13, 16],
        ("gpt-small", False): [13, 61, 64],
        ("gpt-mini", True): [7, 31, 34],
        ("gpt-mini", False): [7, 31, 34],
    }
    tp = levels(SMALL, v_shape(8), cut_blocks=False, cut_head=True)  # tensor parallel's blocks
    assert [len(g) for g in tp] == [13, 16]


def test_an_equal_split_fills_every_stage_it_can_and_under_a_v_spares_rank_0() -> None:
    assert equal_layers(4, one_each(6)) == [
        range(0, 0),
        *map(range, [0, 1, 2, 3], [1, 2, 3, 4]),
        range(4, 4),
    ]
    # one stage short: only the head's stage goes without a block
    assert equal_layers(4, one_each(5)) == [*map(range, [0, 1, 2, 3], [1, 2, 3, 4]), range(4, 4)]
    assert equal_layers(6, one_each(4)) == list(map(range, [0, 2, 4, 5], [2, 4, 5, 6]))
    # under a V rank 0 runs the first and the last stage: the middle stages take the extra
    assert equal_layers(6, v_shape(4)) == list(map(range, [0, 1, 3, 5], [1, 3, 5, 6]))
    with pytest.raises(ValueError):
        equal_layers(1, one_each(4))


def test_more_stages_than_items_is_refused() -> None:
    with pytest.raises(ValueError):
        items = costs([0.1, 0.4, 0.15, 0.15, 0.15, 0.15, 1.7])  # 7 items
        balanced_split(items, v_shape(8), config(1, 1))


@given(st.integers(1, 2), st.integers(1, 4), st.data())
def test_the_v_split_is_the_fastest_then_the_most_even(
    n_layer: int, head_slices: int, data: st.DataObject
) -> None:
    """Against brute force: every way to cut the items into 2 x pairs stages."""
    shape, times = drawn_items(data, n_layer, head_slices)
    pairs = data.draw(st.integers(1, min(len(times) // 2, 4)))
    assert_the_best_split(shape, times, v_shape(2 * pairs))


@given(st.lists(st.floats(0.1, 100), min_size=1, max_size=8), st.integers(8, 512))
def test_shares_keep_the_global_batch_and_follow_speed(speeds: list[float], batch: int) -> None:
    shares = batch_shares(speeds, batch)
    assert sum(shares) == batch
    assert min(shares) >= 1
    fastest, slowest = speeds.index(max(speeds)), speeds.index(min(speeds))
    assert shares[fastest] >= shares[slowest]


def test_slices_of_shares_tile_the_batch() -> None:
    shares = [5, 3]
    assert [share_slice(16, shares, r) for r in range(2)] == [(16, 5), (21, 3)]
    assert batch_shares([2.0, 1.0], 12) == [8, 4]
