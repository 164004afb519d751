"""Search strategies: `exact` equals `exhaustive` on random non-convex instances;
`pruned-tree` is the thesis' algorithm, whose misses are counted, not hidden; the
table 4.1 setup is searched with fewer evaluations than the thesis reports."""

from __future__ import annotations

import random

import pytest

from bbgrap.search.conv_cost import ConvCost
from bbgrap.search.objective import NodeCost, Weights
from bbgrap.search.strategies import search


class RandomCost:
    """A random cost table: no convexity, no monotonicity; `ties` draws small integers."""

    def __init__(self, extent: int, seed: int, ties: bool) -> None:
        self.extent, self.rng, self.ties, self.table = extent, random.Random(seed), ties, {}

    def draw(self) -> float:
        return self.rng.randint(0, 3) if self.ties else self.rng.random()

    def node_cost(self, node: int, start: int, stop: int) -> NodeCost:
        key = (node, start, stop)
        if key not in self.table:
            size = stop - start
            self.table[key] = NodeCost(self.draw() * size, self.draw() if size else 0.0, self.draw() if size else 0.0)
        return self.table[key]


def instance(seed: int):  # -> (cost, speeds, threshold, weights)
    r = random.Random(seed)
    nodes = r.randint(2, 5)
    ties = seed % 2 == 1
    weights = Weights(*(r.randint(0, 2) for _ in range(4))) if ties else Weights(*(r.random() for _ in range(4)))
    return RandomCost(r.randint(4, 36), seed, ties), [r.randint(1, 4) for _ in range(nodes)], r.choice([5, 10, 20, 30, 50]), weights


def test_exact_equals_exhaustive_on_random_instances() -> None:
    checked = 0
    for seed in range(1500):
        cost, speeds, threshold, weights = instance(seed)
        ref = search(cost, speeds, threshold, weights, "exhaustive")
        got = search(cost, speeds, threshold, weights, "exact")
        assert (got.objective, got.cuts) == (ref.objective, ref.cuts), f"seed {seed}"
        assert got.evaluated <= ref.evaluated
        checked += 1
    assert checked == 1500


def pruned_tree_misses(seeds: range) -> int:
    """How often the thesis' pruned tree search returns a worse objective than exhaustive."""
    misses = 0
    for seed in seeds:
        cost, speeds, threshold, weights = instance(seed)
        ref = search(cost, speeds, threshold, weights, "exhaustive")
        misses += search(cost, speeds, threshold, weights, "pruned-tree").objective > ref.objective
    return misses


def test_pruned_tree_misses_are_reported() -> None:
    # The thesis' pruning assumes the objective is convex along each tree; random tables are
    # not, and it misses there. Measured: 81 misses in these 300 instances (27 %).
    misses = pruned_tree_misses(range(300))
    assert 0 < misses < 300
    print(f"pruned-tree missed the optimum on {misses} of 300 random instances")


def test_pruned_tree_never_beats_exhaustive() -> None:
    for seed in range(200):
        cost, speeds, threshold, weights = instance(seed)
        ref = search(cost, speeds, threshold, weights, "exhaustive")
        assert search(cost, speeds, threshold, weights, "pruned-tree").objective >= ref.objective


@pytest.mark.parametrize(("nodes", "threshold", "thesis_evaluated"), [(2, 20, None), (4, 5, None), (4, 20, 4622), (8, 10, None)])
def test_table_4_1_exact_evaluates_few_candidates(nodes: int, threshold: int, thesis_evaluated: int | None) -> None:
    cost = ConvCost(488, 448, (1.0,) * nodes)
    exact = search(cost, [1] * nodes, threshold, Weights(), "exact")
    pruned = search(cost, [1] * nodes, threshold, Weights(), "pruned-tree")
    assert exact.evaluated < pruned.evaluated
    assert exact.objective <= pruned.objective
    if thesis_evaluated is not None:
        assert exact.evaluated < thesis_evaluated


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="unknown search strategy"):
        search(ConvCost(10, 4, (1.0, 1.0)), [1, 1], 20, Weights(), "genetic")


def test_exhaustive_refuses_huge_bands() -> None:
    with pytest.raises(ValueError, match="exhaustive search refused"):
        search(ConvCost(488, 448, (1.0,) * 8), [1] * 8, 20, Weights(), "exhaustive")
