"""Contiguous splits of a sequence of item costs into pipeline stages (pure arithmetic).

`min_max_split`: `parts` groups, minimising the largest group sum (one stage per rank).
`min_max_pairs_split`: `parts` groups where rank r runs group r and group parts - 1 - r
(ZB-V's placement), minimising the largest pair sum. Both take `limits`: other costs
(times, memory) with a bound no group (or pair) may exceed. Minimising the largest sum of
negated values maximises the smallest sum, which is how a caller balances the fastest
stage once the slowest is fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Other costs and the bound on a group's (ZB-V: a pair's) sum of each.
Limits = Sequence[tuple[Sequence[float], float]]
_TOLERANCE = 1e-9  # relative: a bound taken from a previous pass's float sums


def min_max_split(
    values: list[float], parts: int, *, limits: Limits = ()
) -> tuple[float, list[int]]:
    """Dynamic programme over contiguous splits of `values` into `parts` non-empty
    groups: the smallest possible largest group sum, and the cut points; groups breaking
    a limit are not allowed (inf and no cuts when no split keeps them)."""
    n = len(values)
    prefix = _prefix(values)
    bounded = _bounded(limits)
    inf = float("inf")
    # best[k][i]: the first i values in k groups.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = -inf
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                if best[k - 1][j] == inf or not bounded(((j, i),)):
                    continue
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    if best[parts][n] == inf:
        return inf, []
    cuts, i = [], n
    for k in range(parts, 1, -1):
        i = cut[k][i]
        cuts.append(i)
    return best[parts][n], sorted(cuts)


def min_max_pairs_split(
    values: list[float], parts: int, *, limits: Limits = ()
) -> tuple[float, list[int]]:
    """As `min_max_split`, but a group's cost is the sum of the pair of stages one rank
    runs under ZB-V: stage r with stage parts - 1 - r. The pairs are chosen from both ends
    inwards: state (i, j) = the front stages cover values[:i] and the back ones values[j:];
    the innermost pair must meet (i == j). O(parts * n^4) at worst, for n items."""
    n, pairs = len(values), parts // 2
    prefix = _prefix(values)
    bounded = _bounded(limits)
    # layer[(i, j)] = (the largest pair sum so far, the state it came from)
    layers: list[dict[tuple[int, int], tuple[float, tuple[int, int]]]] = [
        {(0, n): (-float("inf"), (0, n))}
    ]
    for r in range(pairs):
        after = 2 * (pairs - r - 1)  # items the pairs still to come need at least
        nxt: dict[tuple[int, int], tuple[float, tuple[int, int]]] = {}
        for (i, j), (cost, _) in layers[-1].items():
            for i2 in range(i + 1, j):
                for j2 in range(i2 + after, j) if after else (i2,):
                    if not bounded(((i, i2), (j2, j))):
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


def _bounded(limits: Limits) -> Callable[[Sequence[tuple[int, int]]], bool]:
    """A test of whether spans [(a, b), ...] of items, taken together (one stage, or a
    ZB-V pair), keep every limit."""
    checks = [(_prefix(costs), bound + _TOLERANCE * abs(bound)) for costs, bound in limits]

    def bounded(spans: Sequence[tuple[int, int]]) -> bool:
        return all(sum(p[b] - p[a] for a, b in spans) <= bound for p, bound in checks)

    return bounded


def _prefix(values: Sequence[float]) -> list[float]:
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    return prefix
