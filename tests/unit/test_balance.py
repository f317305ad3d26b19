"""Stage splits and batch shares (pure arithmetic)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.balance import (
    TIME_SLACK,
    ItemCost,
    balanced_split,
    batch_shares,
    equal_layers,
    share_slice,
    stage_costs,
)


def costs(times: list[float], memory: list[int] | None = None) -> list[ItemCost]:
    memory = memory or [1] * len(times)
    return [ItemCost(t, m) for t, m in zip(times, memory, strict=True)]


def one_each(stages: int) -> list[list[int]]:
    """A stage per pipeline rank (GPipe, 1F1B)."""
    return [[s] for s in range(stages)]


def v_shape(stages: int) -> list[list[int]]:
    """ZB-V: rank r runs stages r and stages - 1 - r."""
    return [[r, stages - 1 - r] for r in range(stages // 2)]


def test_a_heavy_head_gets_fewer_blocks_than_an_equal_split() -> None:
    items = costs([0.1, 1, 1, 1, 1, 1, 1, 1.7])  # embeddings, 6 blocks, head
    equal = stage_costs(items, equal_layers(6, one_each(2)), one_each(2))
    split = balanced_split(items, one_each(2))
    assert [list(r) for r in split.layers] == [[0, 1, 2, 3], [4, 5]]
    assert split.time_ratio < 1.15 < equal.time_ratio


def test_a_head_as_costly_as_two_blocks_is_a_stage_of_its_own() -> None:
    items = costs([0.1, 1, 1, 1, 1, 1, 1, 1.7])  # gpt-mini's shape at pp = 4
    split = balanced_split(items, one_each(4))
    assert [list(r) for r in split.layers] == [[0, 1], [2, 3], [4, 5], []]
    assert split.time_s == [2.1, 2, 2, 1.7]
    assert (
        stage_costs(items, equal_layers(6, one_each(4)), one_each(4)).time_ratio
        > 2 * split.time_ratio
    )


def test_memory_decides_between_splits_of_about_the_same_time() -> None:
    # Blocks of equal time; the last block is heavy in memory: it goes alone if time allows.
    items = costs([0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 10, 0])
    split = balanced_split(items, one_each(2))
    assert [list(r) for r in split.layers] == [[0, 1], [2, 3]]
    assert split.memory_bytes == [2, 11]


@given(
    st.lists(st.floats(0.01, 10), min_size=3, max_size=14),
    st.integers(1, 6),
)
def test_the_split_is_contiguous_covers_every_block_and_beats_equal(
    times: list[float], stages: int
) -> None:
    n_layer = len(times) - 2
    stages = min(stages, n_layer)
    items = costs(times)
    split = balanced_split(items, one_each(stages))
    assert [b for r in split.layers for b in r] == list(range(n_layer))
    assert all(len(r) >= 1 for r in split.layers[1:-1])  # only an end holds no block
    equal = stage_costs(items, equal_layers(n_layer, one_each(stages)), one_each(stages))
    assert max(split.time_s) <= max(equal.time_s) * (1 + 0.05) + 1e-9


def test_zbv_pairs_the_head_with_the_embeddings_on_one_rank() -> None:
    items = costs([0.1, 1, 1, 1, 1, 1, 1, 1.7])  # gpt-mini's shape at pp = 2 under ZB-V
    split = balanced_split(items, v_shape(4))
    assert split.ranks == [[0, 3], [1, 2]]
    assert max(split.rank_time_s) <= 4.0  # the total 7.8 over two ranks, whole blocks
    assert split.time_ratio < 1.06
    equal = stage_costs(items, equal_layers(6, v_shape(4)), v_shape(4))
    assert split.time_ratio <= equal.time_ratio  # here the equal V split is as good


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
        balanced_split(costs([0.1, 1, 1.7]), v_shape(4))


@given(st.lists(st.floats(0.01, 10), min_size=4, max_size=9), st.integers(1, 4))
def test_the_v_split_is_the_best_of_every_contiguous_split(times: list[float], pairs: int) -> None:
    """Against brute force: every way to cut the items into 2 x pairs stages."""
    stages = min(2 * pairs, len(times) // 2 * 2)
    items = costs(times)
    split = balanced_split(items, v_shape(stages))
    assert [b for r in split.layers for b in r] == list(range(len(times) - 2))
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(times)), stages - 1):
        bounds = [0, *cuts, len(times)]
        stage_time = [sum(times[a:b]) for a, b in itertools.pairwise(bounds)]
        best = min(best, max(sum(stage_time[s] for s in pair) for pair in v_shape(stages)))
    # within the slack in which memory (here: the count of items) decides
    assert max(split.rank_time_s) <= best * (1 + TIME_SLACK) + 1e-9


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
